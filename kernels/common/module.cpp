// The Python module object of one extension target (APHRODITE_MODULE_NAME). Importing it loads
// the shared library, whose static initialisers register the ops with torch; the module itself
// holds nothing. Built against the stable ABI, so one file serves every Python >= 3.10.
#include <Python.h>

#define APHRODITE_STR_(x) #x
#define APHRODITE_STR(x) APHRODITE_STR_(x)
#define APHRODITE_CAT_(a, b) a##b
#define APHRODITE_CAT(a, b) APHRODITE_CAT_(a, b)

PyMODINIT_FUNC APHRODITE_CAT(PyInit_, APHRODITE_MODULE_NAME)(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, APHRODITE_STR(APHRODITE_MODULE_NAME),
                               "aphrodite_ext kernels; call them through torch.ops.",
                               0,  // no per-module state
                               nullptr};
  return PyModule_Create(&module);
}
