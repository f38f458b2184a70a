// FA2-style flash attention forward built from CuTe (SM80 tensor-core atoms, which every arch
// of the family runs: 8.0 through 12.0). Torch-free; included by the generated instantiations.
//
// One CTA of 4 warps per (64- or 128-row query tile, head, sequence); warp w owns query rows
// 16w + 64i + [0, 16) of the tile, i < kBlockM / 64: 128 rows up to head dim 128
// (default_block_m), the shape FA2 runs there, so that each K/V tile in shared memory serves
// twice the rows. Q stays in shared memory and is read per k block; P is converted from the S
// accumulators in registers. K/V tiles of 64 rows stream through swizzled shared memory with
// cp.async, K and V in separate buffers so that the load of V(j) overlaps S = Q K(j)^T and the
// softmax, and the load of K(j-1) overlaps O += P V(j). Key tiles are visited from the last to
// the first, so the tiles that need masking (the partial end, the causal diagonal or right window
// edge) come first; with a left window edge the tile range starts at the first tile any row of
// the CTA sees, and only the tiles that straddle an edge are masked.
// Softmax statistics stay in fp32 registers; the 4 lanes that share a row of the mma accumulator
// reduce with two xor shuffles. The paged variants (KvLayout) find K/V rows through the block
// table, whose entries are read one tile ahead while the current tile's scores are computed (head
// dims up to 128; above, registers allow only resolving at each load); the block-size division is
// a multiply-high with constants the launch computes. Where the block size is a multiple of the
// 64-row K/V tile (kPagedTiles), a tile lies in one cache block: one entry a tile, the same for
// every thread, and the dense copy from one row pointer (bf16 at head dim 128, 128-row tiles: 1017
// SASS instructions a tile without mask against 980 dense and 1134 in row groups). Other block
// sizes (kPagedRows) take a tile's rows in an order (FwdTraits::PagedRowOrder) that puts the rows
// of a thread in pairs r, r + 8 of one 16-row group, hence one cache block: one table entry and
// one 64-bit address per pair.
//
// Registers (the 128-row tile at head dim 128 holds 128 fp32 of O and 64 of S a thread, of 255):
// the ldmatrix loads address shared memory from one base per operand (detail::SmemOperand: an
// XOR and an immediate offset per load, not a register per k block), and whatever the key loop
// derives from the thread index (those bases, the copy rows and columns, the mask's key - row) is
// derived in each tile from tid plus a 0 read from shared memory, which the compiler cannot hoist
// into registers held across the loop; the masks need no per-row bounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>

#include "common/fast_div.h"
#include "common/gpu.h"
#include "flash_attn/flash_attn.h"

namespace aphrodite::flash_attn {

/// Query rows per CTA: 128 (each warp 32 rows, two mma tiles) where the accumulators fit the
/// register file without spilling (ptxas -v, sm_90a: 255 registers and no spill at head dim 128,
/// dense and paged), else 64 (each warp 16 rows): above 128 the O accumulator alone would take
/// 192 or 256 registers a thread. The softcap kernels keep 64 rows above head dim 64 (see
/// flash_fwd_launch).
constexpr int default_block_m(int head_dim) { return head_dim <= 128 ? 128 : 64; }

template <int kHeadDim_, typename Element_, bool kCausal_,
          int kBlockM_ = default_block_m(kHeadDim_)>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCausal = kCausal_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kBlockM = kBlockM_;
  static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row mma tiles");
  static constexpr int kBlockN = 64;
  static_assert(kHeadDim % 32 == 0, "head dims are multiples of 32");
  // Shared-memory rows are tiled in 64-element (128-byte) chunks where the head dim allows,
  // else 32; the swizzle spreads the 8 rows of an ldmatrix over all banks.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 64 ? 3 : 2;

  using MmaOp =
      std::conditional_t<std::is_same_v<Element, cute::half_t>, cute::SM80_16x8x16_F32F16F16F32_TN,
                         cute::SM80_16x8x16_F32BF16BF16F32_TN>;
  // Warps tile M; each warp covers 16 x 16 per step (two 16x8x16 atoms along N), so that one
  // x4 ldmatrix feeds a B operand.
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<MmaOp>,
                                  cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>>;

  using SmemAtom =
      decltype(cute::composition(cute::Swizzle<kSwizzleBits, 3, 3>{},
                                 cute::Layout<cute::Shape<cute::_8, cute::Int<kBlockKSmem>>,
                                              cute::Stride<cute::Int<kBlockKSmem>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // V seen as (head_dim, keys): the B operand of O += P V. Vt(i, j) = V(j, i).
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                        cute::GenRowMajor{})));

  // Global <-> shared: 16-byte vectors, a row of kBlockKSmem elements per kBlockKSmem/8 threads.
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / 8;
  using GmemThreadLayout = cute::Layout<
      cute::Shape<cute::Int<kNThreads / kGmemThreadsPerRow>, cute::Int<kGmemThreadsPerRow>>,
      cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
  using GmemCopyIn = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      GmemThreadLayout{}, cute::Layout<cute::Shape<cute::_1, cute::_8>>{}));
  using GmemCopyOut = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemThreadLayout{},
      cute::Layout<cute::Shape<cute::_1, cute::_8>>{}));

  // The paged variant reorders the rows of every tile it copies (Q, K, V and O; the same
  // permutation on the global and the shared-memory side) so that the rows a thread copies lie
  // in few 16-row groups: a cache block is a multiple of 16 rows, so one block-table entry serves
  // a group. In pass m of a copy, thread row a (of kGmemRowsPerPass) copies tile row
  // (a % 8) + 16 (a / 8) + 8 (m % 2) + 2 kGmemRowsPerPass (m / 2): passes 2h and 2h + 1 share a
  // group (rows r and r + 8), so a thread reads kCopyPasses / 2 entries a K/V tile. Its rows keep
  // one row % 8, so the swizzle is the same in all of them: the shared-memory side stays one base
  // register plus constant offsets, shared by the Q, K, V and O copies as in the dense layout.
  static constexpr int kGmemRowsPerPass = kNThreads / kGmemThreadsPerRow;
  static constexpr int kCopyPasses = kBlockN / kGmemRowsPerPass;
  static_assert(kGmemRowsPerPass % 8 == 0 && kCopyPasses % 2 == 0);
  template <int kRows>
  using PagedRowOrder =
      cute::Layout<cute::Shape<cute::_8, cute::Int<kGmemRowsPerPass / 8>, cute::_2,
                               cute::Int<kRows / (2 * kGmemRowsPerPass)>>,
                   cute::Stride<cute::_1, cute::_16, cute::_8, cute::Int<2 * kGmemRowsPerPass>>>;

  static constexpr int kSmemQElems = kBlockM * kHeadDim;
  static constexpr int kSmemKVElems = kBlockN * kHeadDim;
  // After the tiles: one 32-bit word holding 0 (see the kernel's tile loop).
  static constexpr int kSmemZeroOffset =
      (kSmemQElems + 2 * kSmemKVElems) * static_cast<int>(sizeof(Element));
  static constexpr int kSmemBytes = kSmemZeroOffset + 16;
};

namespace detail {

// Rearranges an mma accumulator layout ((2, 2), MMA_M, MMA_N) into (rows, cols) =
// ((2, MMA_M), (2, MMA_N)): value mode 0 of the SM80 16x8 C layout steps the column, mode 1
// steps the row by 8.
template <typename Layout>
CUTE_HOST_DEVICE auto acc_rowcol(Layout acc) {
  using namespace cute;
  static_assert(decltype(rank(acc))::value == 3);
  static_assert(decltype(rank<0>(acc))::value == 2);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<2>(acc)));
}

// Reinterprets an accumulator layout ((2, 2), MMA_M, MMA_N) as the A operand of the next
// 16x8x16 mma, ((2, 2, 2), MMA_M, MMA_N / 2): the A registers of a thread are (column pair,
// row half, k half), and the k halves are two adjacent 8-column accumulator atoms.
template <typename Layout>
CUTE_HOST_DEVICE auto acc_as_a(Layout acc) {
  using namespace cute;
  static_assert(decltype(size<2>(acc))::value % 2 == 0);
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<2, 0>(l)), get<1>(l),
                     get<2, 1>(l));
}

// x behind an asm copy: the compiler cannot see how it was computed, so it cannot split a sum
// into parts and move the invariant ones out of a loop into registers of their own.
__device__ __forceinline__ int opaque(int x) {
  int y;
  asm("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// 2^x with results below 2^-126 flushed to zero: one MUFU.EX2. exp2f without -ftz wraps each
// in a range test and two multiplies (to return subnormals), which the softmax's p in [0, 1]
// and its correction factor never need.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|) in (0, 1]: no overflow, the quotient's
// denominator stays in [1, 2], and the absolute error is a few ulp of 1 over the whole range (the
// softcap multiplies it by the cap). tanh.approx.f32 would be one instruction, but its relative
// error of about 2^-11 becomes a logit error of cap * 2^-11 at saturation.
__device__ __forceinline__ float tanh_accurate(float x) {
  const float e = exp2f(-2.f * static_cast<float>(M_LOG2E) * fabsf(x));
  return copysignf(__fdividef(1.f - e, 1.f + e), x);
}

// Copies the rows of a (kRows, head_dim) tile that lie before `valid_rows` with the tiled
// copy; zero-fills the others in shared memory, so that padding never feeds a NaN into P V.
// row_of(m): the tile row of the thread's pass m. kFull: the caller knows every row is valid
// (no test, no zero fill).
template <bool kFull = false, typename TiledCopy, typename TS, typename TD, typename RowOf>
__device__ __forceinline__ void copy_rows(const TiledCopy& tiled_copy, const TS& src, TD& dst,
                                          const RowOf& row_of, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (kFull || row_of(m) < valid_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
    } else {
      clear(dst(_, m, _));
    }
  }
}

// ldmatrix operands without one address register per k block. In the swizzled layouts
// (FwdTraits::SmemAtom) the 16-byte row a thread reads for column block j (16 columns: a k
// block of Q or K, a head-dim block of V^T) lies at its j = 0 address with the 16-byte column
// index XORed with 2 (j % kXorSteps), kXorSteps = kBlockKSmem / 16, plus offsets that are
// multiples of the swizzle's period (rows in steps of 16, the next kBlockKSmem-column chunk),
// which commute with the XOR. So one base address per operand and thread serves every load:
// each load XORs the base (plus its chunk offset) and takes the rest as its immediate offset.
// Left to CuTe's partitions, each XORed address was a register of its own held across the key
// loop (20 at head dim 128, 128-row tiles). tests/build/flash_attn_layout_check.cu checks the
// addresses against CuTe's partitions.
struct SmemOperand {
  uint32_t base;  // shared-memory byte address of the thread's row for block (0, 0)
};

// One x4 ldmatrix (kTrans: .trans) at byte address ((base + kPre) ^ kFlip) + kPost into dst, a
// fragment view of 8 16-bit values (4 registers in the order of CuTe's SM75_U32x4_LDSM_N and
// SM75_U16x8_LDSM_T copies, whose retile_D views the callers pass). kPre and kPost are multiples
// of the swizzle's period (128 bytes), so they can sit on either side of the XOR.
template <bool kTrans, int kPre, int kFlip, int kPost, typename Dst>
__device__ __forceinline__ void ldsm_x4(uint32_t base, Dst&& dst) {
  auto d = cute::recast<uint32_t>(dst);
  static_assert(decltype(cute::size(d))::value == 4);
  static_assert(kPre % 128 == 0 && kPost % 128 == 0 && kFlip < 128);
  uint32_t addr = base;
  if constexpr (kPre != 0) asm("add.u32 %0, %1, %2;" : "=r"(addr) : "r"(addr), "n"(kPre));
  if constexpr (kFlip != 0) asm("xor.b32 %0, %1, %2;" : "=r"(addr) : "r"(addr), "n"(kFlip));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.x4.trans.m8n8.shared.b16 {%0, %1, %2, %3}, [%4+%5];\n"
                 : "=r"(d(0)), "=r"(d(1)), "=r"(d(2)), "=r"(d(3))
                 : "r"(addr), "n"(kPost));
  } else {
    asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4+%5];\n"
                 : "=r"(d(0)), "=r"(d(1)), "=r"(d(2)), "=r"(d(3))
                 : "r"(addr), "n"(kPost));
  }
}

// Byte offsets of the loads of FwdTraits' operands, kXorSteps = kBlockKSmem / 16 column blocks
// per chunk of a shared-memory row. Block (i, j): i the fragment's mode 1 (m or n), j its mode 2
// (the k block). A (Q, kRows rows): i steps 16 kNWarps rows, j steps 16 columns. B (K): i steps
// 16 rows, j 16 columns. B transposed (V^T): i steps 16 columns (head dim), j 16 rows (keys).
template <typename Traits, int kRows>
struct OperandOffsets {
  static constexpr int kBKS = Traits::kBlockKSmem;
  static constexpr int kXorSteps = kBKS / 16;
  static constexpr int kBytes = 2;  // 16-bit elements
  // Column block c (16 columns) of row 0, rows stepped separately.
  static constexpr int col_flip(int c) { return (c % kXorSteps) * 16 * kBytes; }
  static constexpr int col_offset(int c) { return (c / kXorSteps) * kRows * kBKS * kBytes; }
  static constexpr int rows_offset(int rows) { return rows * kBKS * kBytes; }
};

// Loads block (i, j) of an A operand (kTrans false, Q), B operand (K) or transposed B (V^T).
enum class Operand { kA, kB, kBt };
template <Operand kOp, typename Traits, int kRows, int i, int j, typename Dst>
__device__ __forceinline__ void load_block(const SmemOperand& s, Dst&& dst) {
  using O = OperandOffsets<Traits, kRows>;
  // The column block's chunk offset goes before the XOR: blocks j and j + kXorSteps then derive
  // different addresses, which the compiler does not merge into one register held from the
  // first to the second.
  constexpr int kCol = kOp == Operand::kBt ? i : j;
  constexpr int kRowsStep = kOp == Operand::kA   ? 16 * Traits::kNWarps * i
                            : kOp == Operand::kB ? 16 * i
                                                 : 16 * j;
  ldsm_x4<kOp == Operand::kBt, O::col_offset(kCol), O::col_flip(kCol), O::rows_offset(kRowsStep)>(
      s.base, dst);
}

// Loads k block j of an operand fragment view (all of its mode 1).
template <Operand kOp, typename Traits, int kRows, int j, typename View>
__device__ __forceinline__ void load_k_block(const SmemOperand& s, View& view) {
  using namespace cute;
  for_each(make_int_sequence<decltype(size<1>(view))::value>{}, [&](auto i) {
    load_block<kOp, Traits, kRows, decltype(i)::value, j>(s, view(_, i, j));
  });
}

// acc += A B over the k blocks, A (Q, kRowsA rows) and B (K) loaded from shared memory by
// ldmatrix one k block ahead of the mma that uses it. rA_view/rB_view are rA/rB retiled for the
// copies.
template <typename Traits, int kRowsA, typename Acc, typename RA, typename RB, typename VA,
          typename VB, typename Mma>
__device__ __forceinline__ void gemm_ss(Acc& acc, RA& rA, RB& rB, VA& rA_view, VB& rB_view,
                                        const SmemOperand& sA, const SmemOperand& sB,
                                        const Mma& mma) {
  using namespace cute;
  constexpr int kBlocks = decltype(size<2>(rA))::value;
  load_k_block<Operand::kA, Traits, kRowsA, 0>(sA, rA_view);
  load_k_block<Operand::kB, Traits, Traits::kBlockN, 0>(sB, rB_view);
  for_each(make_int_sequence<kBlocks>{}, [&](auto k_) {
    constexpr int k = decltype(k_)::value;
    if constexpr (k + 1 < kBlocks) {
      load_k_block<Operand::kA, Traits, kRowsA, k + 1>(sA, rA_view);
      load_k_block<Operand::kB, Traits, Traits::kBlockN, k + 1>(sB, rB_view);
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  });
}

// acc += A B with A already in registers (P) and B (V^T) from shared memory, B loaded one k
// block ahead of the mma that uses it.
template <typename Traits, typename Acc, typename RA, typename RB, typename VB, typename Mma>
__device__ __forceinline__ void gemm_rs(Acc& acc, const RA& rA, RB& rB, VB& rB_view,
                                        const SmemOperand& sB, const Mma& mma) {
  using namespace cute;
  constexpr int kBlocks = decltype(size<2>(rA))::value;
  load_k_block<Operand::kBt, Traits, Traits::kBlockN, 0>(sB, rB_view);
  for_each(make_int_sequence<kBlocks>{}, [&](auto k_) {
    constexpr int k = decltype(k_)::value;
    if constexpr (k + 1 < kBlocks) {
      load_k_block<Operand::kBt, Traits, Traits::kBlockN, k + 1>(sB, rB_view);
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  });
}

}  // namespace detail

/// Where the kernel finds K/V rows. kDense: row cu_seqlens_k[b] + j of k/v. Paged (through the
/// block table), by the launch from the block size: kPagedTiles where it is a multiple of the
/// kBlockN rows of a K/V tile (every tile then lies in one cache block), kPagedRows for the others.
enum class KvLayout { kDense, kPagedRows, kPagedTiles };

template <typename Traits, KvLayout kKv, bool kSoftcap>
__global__ void __launch_bounds__(Traits::kNThreads) flash_fwd_kernel(const FwdProblem p) {
  using namespace cute;
  constexpr bool kPaged = kKv != KvLayout::kDense;
  // Each thread's K/V rows resolved in 16-row groups (FwdTraits::PagedRowOrder).
  constexpr bool kRowGroups = kKv == KvLayout::kPagedRows;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;

  const int m_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;

  const int q_start = p.cu_seqlens_q[batch];
  const int seqlen_q = p.cu_seqlens_q[batch + 1] - q_start;
  // Paged keys start at row 0 of the sequence's first block; cu_seqlens_k only gives lengths.
  const int k_start = kPaged ? 0 : p.cu_seqlens_k[batch];
  const int seqlen_k = p.seqused_k != nullptr ? p.seqused_k[batch]
                                              : p.cu_seqlens_k[batch + 1] - p.cu_seqlens_k[batch];
  const int m0 = m_block * kBlockM;
  if (m0 >= seqlen_q) return;  // the grid covers max_seqlen_q
  const int kv_head = head / (p.num_heads / p.num_kv_heads);
  const int q_rows = min(kBlockM, seqlen_q - m0);
  // Key position of query 0 (bottom-right alignment): query i sits at key i + diag.
  const int diag = seqlen_k - seqlen_q;

  // The keys tile row `row` sees: [key_lo(row), key_hi(row)], clipped to the sequence (so the
  // partial last tile needs no test of its own). Both ends are non-decreasing in the row, so the
  // CTA's first row bounds the right edge from below and its last row the left edge from above.
  // The edges of row 0 are summed in 64 bits (a window size may be up to 2^31 - 1) and clamped
  // to where adding a row (< kBlockM) stays in int and clips the same: per row, two int ops.
  // Without a window side its edge sits past the clip, so the same code serves every variant.
  int hi_row0 = seqlen_k - 1;
  if (Traits::kCausal || p.window_right >= 0) {
    const int64_t edge = static_cast<int64_t>(m0) + diag + (Traits::kCausal ? 0 : p.window_right);
    hi_row0 =
        edge < -kBlockM - 1 ? -kBlockM - 1 : (edge < hi_row0 ? static_cast<int>(edge) : hi_row0);
  }
  int lo_row0 = -kBlockM;
  if (p.window_left >= 0) {
    const int64_t edge = static_cast<int64_t>(m0) + diag - p.window_left;
    lo_row0 = edge < -kBlockM ? -kBlockM : (edge < seqlen_k ? static_cast<int>(edge) : seqlen_k);
  }
  auto key_hi = [&](int row) { return min(seqlen_k - 1, max(hi_row0 + row, -1)); };
  auto key_lo = [&](int row) { return min(max(lo_row0 + row, 0), seqlen_k); };
  const int hi_first = key_hi(0);          // tiles reaching past it need the right mask
  const int lo_last = key_lo(q_rows - 1);  // tiles starting before it need the left mask
  const int n_block_max = (key_hi(q_rows - 1) + kBlockN) / kBlockN;  // key_hi >= -1
  const int n_block_min = min(key_lo(0) / kBlockN, n_block_max);

  extern __shared__ __align__(128) char smem_raw[];
  // The 0 of the tile loop's thread index: every thread writes it (the same value), so that its
  // own reads in the loop need no barrier to see it.
  *reinterpret_cast<volatile int*>(smem_raw + Traits::kSmemZeroOffset) = 0;
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  Tensor sQ = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{});
  Tensor sK =
      make_tensor(make_smem_ptr(smem + Traits::kSmemQElems), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem + Traits::kSmemQElems + Traits::kSmemKVElems),
                          typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});

  const Element* q_base = static_cast<const Element*>(p.q) +
                          (static_cast<int64_t>(q_start) + m_block * kBlockM) * p.q_row_stride +
                          static_cast<int64_t>(head) * p.q_head_stride;
  // Dense: row 0 of the sequence's keys; paged: the kv head's column of the cache.
  const Element* k_base = static_cast<const Element*>(p.k) +
                          static_cast<int64_t>(k_start) * p.k_row_stride +
                          static_cast<int64_t>(kv_head) * p.k_head_stride;
  const Element* v_base = static_cast<const Element*>(p.v) +
                          static_cast<int64_t>(k_start) * p.v_row_stride +
                          static_cast<int64_t>(kv_head) * p.v_head_stride;
  Element* o_base = static_cast<Element*>(p.out) +
                    (static_cast<int64_t>(q_start) + m_block * kBlockM) * p.o_row_stride +
                    static_cast<int64_t>(head) * p.o_head_stride;

  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;
  Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(p.q_row_stride, _1{}));

  typename Traits::GmemCopyIn gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  // Thread-dependent values used in the key loop are derived there from the thread index t of
  // the tile (tid plus a 0 the compiler cannot see through; see the tile loop): held across the
  // loop instead, they took a dozen registers (addresses, rows, columns), which the 128-row
  // tiles at head dim 128 cannot spare.
  // The row order of the gmem <-> smem tile copies (Q, K, V, O): FwdTraits::PagedRowOrder in the
  // kPagedRows variant, else the identity. order_rows views a (rows, head_dim) tile in that order;
  // copy_row(rows, m) is the tile row of the thread's pass m (the copies share one thread layout,
  // and pass m is kGmemRowsPerPass rows below pass 0 before the reordering, which is linear in
  // the pass and the thread's row).
  auto order_rows = [](auto tile) {
    if constexpr (kRowGroups) {
      constexpr int kRows = decltype(size<0>(tile))::value;
      using Order = typename Traits::template PagedRowOrder<kRows>;
      return make_tensor(
          tile.data(),
          composition(tile.layout(), make_layout(Order{}, Layout<Int<kHeadDim>, Int<kRows>>{})));
    } else {
      return tile;
    }
  };
  // The tile row and column of thread t's first copied vector.
  auto copy_row0 = [&](int t) {
    return get<0>(
        gmem_copy.get_thread_slice(t).partition_S(make_identity_tensor(TileKV{}))(0, 0, 0));
  };
  auto copy_col0 = [&](int t) {
    return get<1>(
        gmem_copy.get_thread_slice(t).partition_S(make_identity_tensor(TileKV{}))(0, 0, 0));
  };
  auto copy_row = [&](int t, auto rows, int m) {
    constexpr int kRows = decltype(rows)::value;
    if constexpr (kRowGroups) {
      using Order = typename Traits::template PagedRowOrder<kRows>;
      return Order{}(copy_row0(t)) + Order{}(m * Traits::kGmemRowsPerPass);
    } else {
      return copy_row0(t) + m * Traits::kGmemRowsPerPass;
    }
  };

  // Paged: kPagedRows, a thread's rows of a K/V tile lie in kPageGroups 16-row groups (FwdTraits'
  // PagedRowOrder); kPagedTiles, the whole tile lies in one cache block (one group). Each group's
  // cache block is read one tile ahead, while the current tile's scores are computed, so the
  // table's latency hides behind the mma. Only the block indices stay live; the row in the block
  // is recomputed at the copy. Groups past seqlen_k are not resolved: the table holds nothing for
  // them (a tile that is visited holds a key at its first row).
  constexpr int kCopyPasses = Traits::kCopyPasses;
  constexpr int kPageGroups = kRowGroups ? kCopyPasses / 2 : 1;
  // Above head dim 128 the O accumulator leaves no registers to hold the indices across the mma
  // (ptxas -v at 256: 32 bytes spilled): each load resolves its own rows, and the table read's
  // latency is small beside those tiles' mma.
  constexpr bool kPrefetchPages = kHeadDim <= 128;
  int page_block[kPageGroups];
  const int32_t* block_table =
      kPaged ? p.block_table + static_cast<int64_t>(batch) * p.block_table_batch_stride : nullptr;
  // key / block_size without a divide and without a branch on the block size: a power of two or
  // not, one multiply-high, an add and a shift (keys are below 2^31, so the add cannot wrap).
  FastDiv block_div;  // the launch's constants for p.block_size
  block_div.mul = p.block_size_mul;
  block_div.shift = p.block_size_shift;
  auto resolve_pages = [&](int t, int n_block) {
    if constexpr (kKv == KvLayout::kPagedTiles) {
      page_block[0] = block_table[block_div.div(n_block * kBlockN)];  // the same for all threads
    } else if constexpr (kRowGroups) {
      CUTE_UNROLL
      for (int g = 0; g < kPageGroups; ++g) {
        const int key = n_block * kBlockN + copy_row(t, Int<kBlockN>{}, 2 * g);
        page_block[g] = key < seqlen_k ? block_table[block_div.div(key)] : 0;
      }
    }
  };

  // Thread t's part of the copy of key tile n_block of K or V (base: row 0 of the sequence's
  // keys, or of the cache when paged, at the kv head) into the shared tile s. full: a
  // compile-time promise that every row of the tile is a key (any tile below the highest one
  // visited), which drops the row tests. The thread's vectors of a row lie at kBlockKSmem steps
  // of mode 2 from its first (checked on the host).
  auto load_kv = [&](int t, const Element* base, int64_t row_stride, int64_t block_stride, auto& s,
                     int n_block, auto full) {
    constexpr bool kFull = decltype(full)::value;
    const int valid_rows = seqlen_k - n_block * kBlockN;
    // Pass m of row pointer `row`.
    auto copy_pass = [&](auto& dst, int m, const Element* row) {
      if (kFull || copy_row(t, Int<kBlockN>{}, m) < valid_rows) {
        CUTE_UNROLL
        for (int k = 0; k < size<2>(dst); ++k) {
          Tensor src =
              make_tensor(make_gmem_ptr(row + k * Traits::kBlockKSmem), Layout<Shape<_8>>{});
          copy(gmem_copy, src, dst(_, m, k));
        }
      } else {
        clear(dst(_, m, _));
      }
    };
    if constexpr (kPaged && !kPrefetchPages) resolve_pages(t, n_block);
    if constexpr (kRowGroups) {
      Tensor dst = gmem_copy.get_thread_slice(t).partition_D(order_rows(s));
      const Element* thread_base = base + copy_col0(t);
      CUTE_UNROLL
      for (int g = 0; g < kPageGroups; ++g) {
        // Rows r and r + 8 of the group (passes 2g and 2g + 1). Block and row are >= 0: unsigned
        // products skip the sign extension.
        const int key = n_block * kBlockN + copy_row(t, Int<kBlockN>{}, 2 * g);
        const uint32_t in_block = key - block_div.div(key) * p.block_size;
        const Element* group = thread_base +
                               static_cast<uint64_t>(static_cast<uint32_t>(page_block[g])) *
                                   static_cast<uint64_t>(block_stride) +
                               static_cast<uint64_t>(in_block) * static_cast<uint64_t>(row_stride);
        copy_pass(dst, 2 * g, group);
        copy_pass(dst, 2 * g + 1, group + 8 * row_stride);
      }
    } else {
      // Dense, or paged with the tile inside one cache block: the thread's rows at fixed steps
      // from one pointer, that of the tile's first key (for kPagedTiles, its block's row
      // in_block), as the dense layout has them.
      const Element* tile_base = base;
      int first_row = n_block * kBlockN;
      if constexpr (kPaged) {
        tile_base += static_cast<uint64_t>(static_cast<uint32_t>(page_block[0])) *
                     static_cast<uint64_t>(block_stride);
        first_row -= block_div.div(first_row) * p.block_size;
      }
      Tensor dst = gmem_copy.get_thread_slice(t).partition_D(s);
      const Element* rows =
          tile_base + copy_col0(t) + static_cast<int64_t>(first_row + copy_row0(t)) * row_stride;
      CUTE_UNROLL
      for (int m = 0; m < size<1>(dst); ++m) {
        copy_pass(dst, m, rows + static_cast<int64_t>(m * Traits::kGmemRowsPerPass) * row_stride);
      }
    }
  };
  {
    Tensor tQsQ = gmem_thr.partition_D(order_rows(sQ));
    detail::copy_rows(
        gmem_copy, gmem_thr.partition_S(order_rows(gQ)), tQsQ,
        [&](int m) { return copy_row(tid, Int<kBlockM>{}, m); }, q_rows);
  }
  if (n_block_max > n_block_min) {
    if constexpr (kPrefetchPages) resolve_pages(tid, n_block_max - 1);
    load_kv(tid, k_base, p.k_row_stride, p.k_block_stride, sK, n_block_max - 1, cute::false_type{});
  }
  cp_async_fence();

  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVt);
  Tensor acc_o = partition_fragment_C(mma, TileQ{});

  // ldmatrix copies into the fragments: CuTe's tiled copies give each thread's row (and the
  // register order); the loads themselves address shared memory through detail::SmemOperand.
  auto smem_copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto smem_copy_k = make_tiled_copy_B(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  auto smem_copy_v = make_tiled_copy_B(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, mma);
  auto smem_operand = [](const auto& copy, int t, const auto& s) {
    return detail::SmemOperand{
        cast_smem_ptr_to_uint(&copy.get_thread_slice(t).partition_S(s)(0, 0, 0))};
  };
  Tensor tSrQ_view = smem_copy_q.get_thread_slice(tid).retile_D(tSrQ);
  Tensor tSrK_view = smem_copy_k.get_thread_slice(tid).retile_D(tSrK);
  Tensor tOrVt_view = smem_copy_v.get_thread_slice(tid).retile_D(tOrVt);

  // Tile coordinates (row, col) of each accumulator element, in the (rows, cols) view.
  Tensor cO = thr_mma.partition_C(make_identity_tensor(TileQ{}));
  Tensor tOcO = make_tensor(cO.data(), detail::acc_rowcol(cO.layout()));

  Tensor o_rc = make_tensor(acc_o.data(), detail::acc_rowcol(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(o_rc))::value;
  float row_max[kRows];
  float row_sum[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.f;
  }
  clear(acc_o);
  // With a softcap the accumulator is replaced by tanh(acc * softmax_scale / softcap) and the
  // softmax scale becomes the softcap (score = softcap * tanh(...)); either way score_scale turns
  // the held value into the natural-log score.
  // A compile-time switch: with the tanh loop in the kernel behind a run-time test, even never
  // taken, the dense forward ran at 0.63x (H100, head dim 64: 152 against 242 TFLOP/s).
  const float score_scale = kSoftcap ? p.softcap : p.softmax_scale;
  const float tanh_scale = kSoftcap ? p.softmax_scale / p.softcap : 0.f;
  const float scale_log2 = score_scale * static_cast<float>(M_LOG2E);
  // Tiles that reach past the first row's right edge (or the end of the keys) or start before
  // the last row's left edge: the first tiles visited and the last.
  auto needs_mask = [&](int key0) { return key0 + kBlockN - 1 > hi_first || key0 < lo_last; };

  // One tile of keys: S = Q K^T, the mask where the tile needs it (kMayMask: tested per tile),
  // the online softmax, O += P V.
  auto tile = [&](int n_block, auto may_mask) {
    constexpr bool kMayMask = decltype(may_mask)::value;
    Tensor acc_s = partition_fragment_C(mma, TileS{});
    clear(acc_s);
    // The thread index of this tile. Where registers are short (128-row tiles above head dim
    // 64; head dims above 128): tid plus a 0 read from shared memory, which the compiler cannot see
    // through, so that what it derives from the index (addresses, rows, columns) is computed in the
    // tile, where it is used, rather than held in registers across the loop. Else tid, and the
    // derivations leave the loop (bf16 dense, head dim 128, 64 rows: 192 registers, 4.08 SASS
    // instructions per HMMA in the unmasked tile, against 164 and 4.55 with the 0; at 256 plain tid
    // spilled 40 bytes).
    constexpr bool kDeriveInTile = (kBlockM == 128 && kHeadDim > 64) || kHeadDim > 128;
    const int t = kDeriveInTile
                      ? tid + *reinterpret_cast<volatile int*>(smem_raw + Traits::kSmemZeroOffset)
                      : tid;
    cp_async_wait<0>();
    __syncthreads();  // K(n_block) landed, and every warp is done reading V(n_block + 1)
    const detail::SmemOperand tile_q = smem_operand(smem_copy_q, t, sQ);
    const detail::SmemOperand tile_k = smem_operand(smem_copy_k, t, sK);
    // A tile that needs no mask lies below the end of the keys: full.
    load_kv(t, v_base, p.v_row_stride, p.v_block_stride, sV, n_block,
            cute::bool_constant<!kMayMask>{});
    cp_async_fence();
    // The next tile's cache blocks (their table reads are in flight during the mma below).
    if (kPaged && kPrefetchPages && n_block > n_block_min) resolve_pages(t, n_block - 1);

    detail::gemm_ss<Traits, kBlockM>(acc_s, tSrQ, tSrK, tSrQ_view, tSrK_view, tile_q, tile_k, mma);

    if constexpr (kSoftcap) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        acc_s(i) = detail::tanh_accurate(acc_s(i) * tanh_scale);
      }
    }

    // Masked after the softcap (tanh would map -inf back into range).
    Tensor s_rc = make_tensor(acc_s.data(), detail::acc_rowcol(acc_s.layout()));
    const int key0 = n_block * kBlockN;
    if (kMayMask && needs_mask(key0)) {
      // key > key_hi(row) or key < key_lo(row), unclipped: key - row > hi_row0, key - row <
      // lo_row0 or key >= seqlen_k (keys are >= 0, rows < kBlockM: the same tests). Written
      // from key - row of the thread's first element, which changes with the tile, plus each
      // element's constant offset: per-row bounds would be loop invariants that the compiler
      // holds in registers across every tile (8 at 128 rows).
      Tensor cS = mma.get_thread_slice(t).partition_C(make_identity_tensor(TileS{}));
      Tensor tScS = make_tensor(cS.data(), detail::acc_rowcol(cS.layout()));
      const int row0 = get<0>(tScS(0, 0));
      const int col0 = get<1>(tScS(0, 0));
      // Behind an asm copy, so that the compiler does not split off the thread's part.
      const int first_key = detail::opaque(key0 + col0);
      const int first_rel = detail::opaque(key0 + col0 - row0);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(s_rc); ++c) {
          const int dc = get<1>(tScS(r, c)) - col0;  // compile-time constants
          const int dr = get<0>(tScS(r, c)) - row0;
          const int rel = first_rel + (dc - dr);
          if (rel > hi_row0 || rel < lo_row0 || first_key + dc >= seqlen_k) {
            s_rc(r, c) = -INFINITY;
          }
        }
      }
    }

    // Online softmax, base 2: p = 2^(s * scale_log2 - max * scale_log2).
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s_rc); ++c) m = fmaxf(m, s_rc(r, c));
      m = detail::quad_max(m);
      // A row that has seen only masked keys keeps max -inf; subtracting 0 keeps its p at 0.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      const float correction = detail::exp2_ftz(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s_rc); ++c) {
        const float pv = detail::exp2_ftz(s_rc(r, c) * scale_log2 - m_scaled);
        s_rc(r, c) = pv;
        sum += pv;
      }
      row_sum[r] = row_sum[r] * correction + sum;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= correction;
    }

    cp_async_wait<0>();
    __syncthreads();  // V(n_block) landed, and every warp is done reading K(n_block)
    if (n_block > n_block_min) {
      // n_block - 1 < n_block_max - 1: a full tile (n_block * kBlockN <= seqlen_k - 1).
      load_kv(t, k_base, p.k_row_stride, p.k_block_stride, sK, n_block - 1, cute::true_type{});
      cp_async_fence();
    }

    // P in the element type, laid out as the A operand of O += P V.
    Tensor rP = make_tensor<Element>(acc_s.layout());
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) rP(i) = static_cast<Element>(acc_s(i));
    Tensor tOrP = make_tensor(rP.data(), detail::acc_as_a(rP.layout()));
    detail::gemm_rs<Traits>(acc_o, tOrP, tOrVt, tOrVt_view, smem_operand(smem_copy_v, t, sVt), mma);
  };
  // Up to head dim 128 the tiles that need no mask run a second copy of the tile without any
  // mask code: behind the run-time test alone, the mask's predicated instructions still took
  // issue slots in every tile (SASS of the bf16 dense kernel at head dim 128, taken apart: about
  // 700 instructions a tile with them, 590 without). Above 128 the second copy put the
  // accumulators on the stack.
  for (int n_block = n_block_max - 1; n_block >= n_block_min; --n_block) {
    if constexpr (kHeadDim <= 128) {
      if (!needs_mask(n_block * kBlockN)) {
        tile(n_block, cute::false_type{});
        continue;
      }
    }
    tile(n_block, cute::true_type{});
  }

  // Epilogue: normalise, write the LSE, stage O through shared memory (sQ) for 16-byte stores.
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float sum = detail::quad_sum(row_sum[r]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(o_rc); ++c) o_rc(r, c) *= inv;
    const int row = get<0>(tOcO(r, 0));
    if (p.lse != nullptr && get<1>(tOcO(r, 0)) == 0 && row < q_rows) {
      const float lse = sum > 0.f ? row_max[r] * score_scale + logf(sum) : -INFINITY;
      p.lse[static_cast<int64_t>(head) * p.total_q + q_start + m0 + row] = lse;
    }
  }

  Tensor rO = make_tensor<Element>(acc_o.layout());
  CUTE_UNROLL
  for (int i = 0; i < size(acc_o); ++i) rO(i) = static_cast<Element>(acc_o(i));
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with sQ (and no copy into it is in flight)
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutQ{});
  auto smem_copy_o = make_tiled_copy_C(Copy_Atom<DefaultCopy, Element>{}, mma);
  auto smem_thr_o = smem_copy_o.get_thread_slice(tid);
  Tensor tOrO_view = smem_thr_o.retile_S(rO);
  Tensor tOsO_w = smem_thr_o.partition_D(sO);
  copy(smem_copy_o, tOrO_view, tOsO_w);
  __syncthreads();

  typename Traits::GmemCopyOut gmem_copy_o;
  auto gmem_thr_o = gmem_copy_o.get_thread_slice(tid);
  Tensor gO = make_tensor(make_gmem_ptr(o_base), TileQ{}, make_stride(p.o_row_stride, _1{}));
  Tensor tOsO = gmem_thr_o.partition_S(order_rows(sO));
  Tensor tOgO = gmem_thr_o.partition_D(order_rows(gO));
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOgO); ++m) {
    if (copy_row(tid, Int<kBlockM>{}, m) < q_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOgO); ++k) copy(gmem_copy_o, tOsO(_, m, k), tOgO(_, m, k));
    }
  }
}

// Starts one kernel of the instantiation (Traits fixes its query tile and so its grid).
template <typename Traits, KvLayout kKv, bool kSoftcap>
gpuError_t flash_fwd_start(const FwdProblem& p, gpuStream_t stream) {
  auto kernel = &flash_fwd_kernel<Traits, kKv, kSoftcap>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > 48 * 1024) {
    const gpuError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != gpuSuccess) return err;
  }
  const dim3 grid((p.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.num_heads, p.batch);
  if (grid.x == 0 || p.batch == 0) return gpuSuccess;
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(p);
  return gpuGetLastError();
}

// Starts the kernel of the problem's K/V layout: paged block sizes that are multiples of the
// K/V tile's rows take kPagedTiles (one table entry and one row pointer a tile, as dense), the
// others kPagedRows.
template <typename Traits, bool kPaged, bool kSoftcap>
gpuError_t flash_fwd_start_kv(const FwdProblem& p, gpuStream_t stream) {
  if constexpr (kPaged) {
    if (p.block_size % Traits::kBlockN == 0) {
      return flash_fwd_start<Traits, KvLayout::kPagedTiles, kSoftcap>(p, stream);
    }
    return flash_fwd_start<Traits, KvLayout::kPagedRows, kSoftcap>(p, stream);
  } else {
    return flash_fwd_start<Traits, KvLayout::kDense, kSoftcap>(p, stream);
  }
}

/// Launches one instantiation; the dispatch (generated) picks it from the problem. kBlockM: the
/// query rows per CTA, 0 for default_block_m(kHeadDim) (the generator's block_m option sets it).
template <int kHeadDim, typename Element, bool kCausal, bool kPaged, int kBlockM = 0>
gpuError_t flash_fwd_launch(const FwdProblem& problem, gpuStream_t stream) {
  using Traits =
      FwdTraits<kHeadDim, Element, kCausal, kBlockM == 0 ? default_block_m(kHeadDim) : kBlockM>;
  FwdProblem p = problem;
  const FastDiv block_div(static_cast<uint32_t>(kPaged ? p.block_size : 1));
  p.block_size_mul = block_div.mul;
  p.block_size_shift = block_div.shift;
  if (p.softcap > 0.f) {
    // The softcap kernels on 128-row tiles spill above head dim 64 (ptxas -v, sm_90a, bf16,
    // dense / paged: 140 / 112 bytes at 96, 180 / 260 at 128; the tanh takes registers the plain
    // kernel leaves free): 64 rows there. At 64 both fit (255 registers, no spill).
    using SoftcapTraits = std::conditional_t<(kHeadDim > 64) && Traits::kBlockM == 128,
                                             FwdTraits<kHeadDim, Element, kCausal, 64>, Traits>;
    return flash_fwd_start_kv<SoftcapTraits, kPaged, true>(p, stream);
  }
  return flash_fwd_start_kv<Traits, kPaged, false>(p, stream);
}

}  // namespace aphrodite::flash_attn
