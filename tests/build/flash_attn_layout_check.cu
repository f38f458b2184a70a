// Host-side check of the register-layout assumptions of kernels/flash_attn/flash_fwd_kernel.cuh
// (CuTe layouts evaluate on the host): the accumulator's (rows, cols) view, its reuse as the A
// operand of O += P V, the lanes that share a row, and the k blocks of both operands. Built and
// run by tests/build/test_flash_attn_gen.py where nvcc and the CUTLASS headers are present.
#include <cstdio>
#include <vector>
#include "flash_attn/flash_fwd_kernel.cuh"
using namespace cute;
using namespace aphrodite::flash_attn;

template <int D, int BM>
int check() {
  using T = FwdTraits<D, cute::half_t, true, BM>;
  typename T::TiledMma mma;
  int bad = 0;
  for (int t = 0; t < 128; ++t) {
    auto thr = mma.get_thread_slice(t);
    auto cC = thr.partition_C(make_identity_tensor(Shape<Int<T::kBlockM>, Int<T::kBlockN>>{}));
    auto cA = thr.partition_A(make_identity_tensor(Shape<Int<T::kBlockM>, Int<T::kBlockN>>{}));
    auto cCA = make_tensor(cC.data(), aphrodite::flash_attn::detail::acc_as_a(cC.layout()));
    if (size(cCA) != size(cA)) {
      printf("size mismatch\n");
      return 1;
    }
    for (int i = 0; i < size(cA); ++i) {
      if (get<0>(cCA(i)) != get<0>(cA(i)) || get<1>(cCA(i)) != get<1>(cA(i))) {
        if (bad++ < 5)
          printf("t%d i%d: C->A (%d,%d) vs A (%d,%d)\n", t, i, (int)get<0>(cCA(i)),
                 (int)get<1>(cCA(i)), (int)get<0>(cA(i)), (int)get<1>(cA(i)));
      }
    }
    auto rc = make_tensor(cC.data(), aphrodite::flash_attn::detail::acc_rowcol(cC.layout()));
    for (int r = 0; r < size<0>(rc); ++r) {
      for (int c = 0; c < size<1>(rc); ++c) {
        if (get<0>(rc(r, c)) != get<0>(rc(r, 0))) bad++;
        // The 4 lanes sharing a row are lane ^ 1, lane ^ 2: same lane / 4, same warp.
        int lane = t % 32, warp = t / 32;
        if (get<0>(rc(r, c)) % 16 % 8 != lane / 4 || get<0>(rc(r, c)) % 64 / 16 != warp) {
          if (bad++ < 5) printf("row of t%d r%d = %d\n", t, r, (int)get<0>(rc(r, c)));
        }
      }
    }
    // O accumulator over (kBlockM, D): rows must match S's rows register by register.
    auto cO = thr.partition_C(make_identity_tensor(Shape<Int<T::kBlockM>, Int<D>>{}));
    auto orc = make_tensor(cO.data(), aphrodite::flash_attn::detail::acc_rowcol(cO.layout()));
    if (size<0>(orc) != size<0>(rc)) bad++;
    for (int r = 0; r < size<0>(rc); ++r)
      if (get<0>(orc(r, 0)) != get<0>(rc(r, 0))) bad++;
    // The lane holding column 0 writes the LSE.
    if ((get<1>(orc(0, 0)) == 0) != (t % 4 == 0)) bad++;
    // P V's B operand: K index of V^T fragment k-block j covers keys 16j..16j+15, as A's does.
    auto cB = thr.partition_B(make_identity_tensor(Shape<Int<D>, Int<T::kBlockN>>{}));
    for (int k = 0; k < size<2>(cB); ++k)
      for (int i = 0; i < size<0>(cB); ++i)
        if (get<1>(cB(i, 0, k)) / 16 != k) bad++;
    for (int k = 0; k < size<2>(cA); ++k)
      for (int i = 0; i < size<0>(cA); ++i)
        if (get<1>(cA(i, 0, k)) / 16 != k) bad++;
  }
  printf("head_dim %d block_m %d: %d mismatches\n", D, BM, bad);
  return bad;
}

// The ldmatrix addresses (detail::load_block): for every thread and fragment block, the base
// (the block (0, 0) address of CuTe's partition) plus the block's chunk offset, XORed with its
// flip, plus its row offset, lands where CuTe's partition puts the block. Offsets in bytes from
// the tile's start (the kernel's tiles start at multiples of 128 bytes, which the XOR keeps).
template <int D, int BM>
int check_ldmatrix_addresses() {
  using T = FwdTraits<D, cute::half_t, false, BM>;
  using Element = typename T::Element;
  using aphrodite::flash_attn::detail::OperandOffsets;
  using OQ = OperandOffsets<T, T::kBlockM>;
  using OKV = OperandOffsets<T, T::kBlockN>;
  typename T::TiledMma mma;
  auto sQ = make_tensor(counting_iterator<int>(0), typename T::SmemLayoutQ{});
  auto sK = make_tensor(counting_iterator<int>(0), typename T::SmemLayoutKV{});
  auto sVt = make_tensor(counting_iterator<int>(0), typename T::SmemLayoutVt{});
  auto copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto copy_k = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto copy_v = make_tiled_copy_B(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  int bad = 0;
  // Block (i, j) of a partition at column block c, row step r (as load_block picks them).
  auto check_block = [&](auto o, int base, int want, int c, int rows, const char* name, int t,
                         int i, int j) {
    const int got = ((base + o.col_offset(c)) ^ o.col_flip(c)) + o.rows_offset(rows);
    if (got != want && bad++ < 5) printf("%s t%d (%d,%d): %d vs %d\n", name, t, i, j, got, want);
  };
  for (int t = 0; t < T::kNThreads; ++t) {
    auto q = copy_q.get_thread_slice(t).partition_S(sQ);
    auto k = copy_k.get_thread_slice(t).partition_S(sK);
    auto v = copy_v.get_thread_slice(t).partition_S(sVt);
    for (int i = 0; i < size<1>(q); ++i)
      for (int j = 0; j < size<2>(q); ++j)
        check_block(OQ{}, 2 * q(0, 0, 0), 2 * q(0, i, j), j, 16 * T::kNWarps * i, "Q", t, i, j);
    for (int i = 0; i < size<1>(k); ++i)
      for (int j = 0; j < size<2>(k); ++j)
        check_block(OKV{}, 2 * k(0, 0, 0), 2 * k(0, i, j), j, 16 * i, "K", t, i, j);
    for (int i = 0; i < size<1>(v); ++i)
      for (int j = 0; j < size<2>(v); ++j)
        check_block(OKV{}, 2 * v(0, 0, 0), 2 * v(0, i, j), i, 16 * j, "V", t, i, j);
  }
  if (T::kSmemQElems * 2 % 128 != 0 || T::kSmemKVElems * 2 % 128 != 0) bad++;
  printf("head_dim %d block_m %d ldmatrix addresses: %d mismatches\n", D, BM, bad);
  return bad;
}

// The paged K/V load: every value a thread copies in pass m of the tiled gmem copy lies in the
// row of its first value (tKVc(0, m, 0)), and partitioning a tile whose rows all alias one row
// (row stride 0) puts each value at that row's base plus the value's column.
template <int D>
int check_paged_gather() {
  using T = FwdTraits<D, cute::half_t, false>;
  using Tile = Shape<Int<T::kBlockN>, Int<D>>;
  typename T::GmemCopyIn gmem_copy;
  int bad = 0;
  for (int t = 0; t < T::kNThreads; ++t) {
    auto thr = gmem_copy.get_thread_slice(t);
    auto c = thr.partition_S(make_identity_tensor(Tile{}));
    // An offset tensor stands in for the row's pointer: element (r, k) at offset k.
    auto g = thr.partition_S(make_tensor(counting_iterator<int>(0), Tile{}, Stride<_0, _1>{}));
    for (int m = 0; m < size<1>(c); ++m) {
      for (int k = 0; k < size<2>(c); ++k) {
        for (int i = 0; i < size<0>(c); ++i) {
          if (get<0>(c(i, m, k)) != get<0>(c(0, m, 0))) bad++;
          if (g(i, m, k) != get<1>(c(i, m, k))) bad++;
        }
      }
    }
  }
  printf("head_dim %d paged gather: %d mismatches\n", D, bad);
  return bad;
}

// The paged row order (FwdTraits::PagedRowOrder) on a tile of kRows rows: a permutation; linear
// in the thread's row and the pass (the kernel adds the two); passes 2h and 2h + 1 of a thread
// land in one 16-row group (so one cache block) at rows r and r + 8, keeping row % 8 (so one
// swizzle); and every pass of a thread keeps row % 8.
template <int D, int kRows>
int check_paged_order() {
  using T = FwdTraits<D, cute::half_t, false>;
  using Order = typename T::template PagedRowOrder<kRows>;
  constexpr int kPerPass = T::kGmemRowsPerPass;
  int bad = 0;
  std::vector<int> seen(kRows, 0);
  for (int r = 0; r < kRows; ++r) {
    const int o = Order{}(r);
    if (o < 0 || o >= kRows || seen[o]++) bad++;
  }
  for (int a = 0; a < kPerPass; ++a) {
    for (int m = 0; m < kRows / kPerPass; ++m) {
      const int row = Order{}(a + m * kPerPass);
      if (row != Order{}(a) + Order{}(m * kPerPass)) bad++;
      if (row % 8 != Order{}(a) % 8) bad++;
      if (m % 2 == 1 && row != Order{}(a + (m - 1) * kPerPass) + 8) bad++;
      if (row / 16 != Order{}(a + (m - m % 2) * kPerPass) / 16) bad++;
    }
  }
  // The paged copy's vectors: column of (m, k) = the thread's first column + kBlockKSmem k.
  typename T::GmemCopyIn gmem_copy;
  for (int t = 0; t < T::kNThreads; ++t) {
    auto c = gmem_copy.get_thread_slice(t).partition_S(
        make_identity_tensor(Shape<Int<T::kBlockN>, Int<D>>{}));
    for (int m = 0; m < size<1>(c); ++m)
      for (int k = 0; k < size<2>(c); ++k) {
        if (get<1>(c(0, m, k)) != get<1>(c(0, 0, 0)) + T::kBlockKSmem * k) bad++;
        if (get<0>(c(0, m, k)) != get<0>(c(0, 0, 0)) + kPerPass * m) bad++;
        for (int i = 0; i < size<0>(c); ++i)
          if (get<1>(c(i, m, k)) != get<1>(c(0, m, k)) + i) bad++;
      }
  }
  printf("head_dim %d paged row order over %d rows: %d mismatches\n", D, kRows, bad);
  return bad;
}

// common/fast_div.h, which the paged index division uses (and the cache, fp8 and marlin kernels):
// n / d for every divisor up to 4096 (block sizes, tile counts, group sizes).
int check_fast_div() {
  int bad = 0;
  for (uint32_t d = 1; d <= 4096; ++d) {
    const aphrodite::FastDiv div(d);
    for (int64_t n = 0; n < (int64_t{1} << 31); n = n < 20000 ? n + 1 : n * 2 + 12345) {
      if (div.div(static_cast<uint32_t>(n)) != n / d) bad++;
    }
    if (div.div(0x7fffffffu) != 0x7fffffffu / d) bad++;
  }
  printf("fast division: %d mismatches\n", bad);
  return bad;
}

int main() {
  const int bad = check<64, 64>() + check<64, 128>() + check<96, 64>() + check<96, 128>() +
                  check<128, 64>() + check<128, 128>() + check<192, 64>() + check<256, 64>() +
                  check_paged_gather<64>() + check_paged_gather<96>() + check_paged_gather<128>() +
                  check_paged_gather<256>() + check_paged_order<64, 64>() +
                  check_paged_order<64, 128>() + check_paged_order<96, 64>() +
                  check_paged_order<128, 64>() + check_paged_order<96, 128>() +
                  check_paged_order<128, 128>() + check_paged_order<256, 64>() + check_fast_div() +
                  check_ldmatrix_addresses<64, 64>() + check_ldmatrix_addresses<64, 128>() +
                  check_ldmatrix_addresses<96, 64>() + check_ldmatrix_addresses<96, 128>() +
                  check_ldmatrix_addresses<128, 64>() + check_ldmatrix_addresses<128, 128>() +
                  check_ldmatrix_addresses<192, 64>() + check_ldmatrix_addresses<256, 64>();
  return bad != 0;
}
