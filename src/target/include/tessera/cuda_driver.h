/* The CUDA driver API, opened at first use: what Tessera's CUDA libraries and the tsr runtime call.
 *
 * libcuda.so.1 is opened with dlopen when a CUDA call is first made, not linked, so a library built
 * here loads on any machine (a build machine without a GPU included) and says "no CUDA driver" when
 * it is called there, instead of failing to load. Types and the versioned symbol names come from the
 * toolkit's cuda.h (cuMemAlloc is cuMemAlloc_v2, ...): the names dlsym looks up are cuda.h's own.
 * Header-only C++ (one table per library that includes it).
 */
#ifndef TESSERA_CUDA_DRIVER_H_
#define TESSERA_CUDA_DRIVER_H_

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <mutex>
#include <string>

namespace tessera {
namespace cuda {

#define TESSERA_CU_NAME2(x) #x
#define TESSERA_CU_NAME(x) TESSERA_CU_NAME2(x)  // the symbol cuda.h maps a name to (cuMemAlloc -> cuMemAlloc_v2)

#define TESSERA_CU_FUNCTIONS(X) \
  X(cuInit)                     \
  X(cuGetErrorString)           \
  X(cuDeviceGet)                \
  X(cuDeviceGetCount)           \
  X(cuDevicePrimaryCtxRetain)   \
  X(cuCtxPushCurrent)           \
  X(cuCtxPopCurrent)            \
  X(cuCtxSynchronize)           \
  X(cuModuleLoadData)           \
  X(cuModuleGetFunction)        \
  X(cuFuncSetAttribute)         \
  X(cuLaunchKernel)             \
  X(cuTensorMapEncodeTiled)     \
  X(cuMemAlloc)                 \
  X(cuMemFree)                  \
  X(cuMemAllocAsync)            \
  X(cuMemFreeAsync)             \
  X(cuMemcpy)                   \
  X(cuMemcpyDtoDAsync)          \
  X(cuStreamCreate)             \
  X(cuStreamDestroy)            \
  X(cuStreamSynchronize)

struct Driver {
#define TESSERA_CU_FIELD(name) decltype(&::name) name = nullptr;
  TESSERA_CU_FUNCTIONS(TESSERA_CU_FIELD)
#undef TESSERA_CU_FIELD
  std::string error;  // why the driver is unusable ("" when it is usable)
};

/* The driver table: libcuda opened and initialised; ``error`` says why not when it cannot be. */
inline Driver OpenDriver() {
  Driver driver;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    driver.error =
        "no CUDA driver here (libcuda.so.1 does not load); CUDA kernels run on a machine with an NVIDIA GPU and "
        "its driver";
    return driver;
  }
#define TESSERA_CU_LOAD(name)                                                                             \
  driver.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, TESSERA_CU_NAME(name)));                   \
  if (driver.name == nullptr && driver.error.empty()) {                                                   \
    driver.error = std::string("the CUDA driver has no ") + TESSERA_CU_NAME(name) + " (driver too old?)"; \
  }
  TESSERA_CU_FUNCTIONS(TESSERA_CU_LOAD)
#undef TESSERA_CU_LOAD
  if (!driver.error.empty()) return driver;
  CUresult status = driver.cuInit(0);
  if (status != CUDA_SUCCESS) {
    const char* text = nullptr;
    driver.cuGetErrorString(status, &text);
    driver.error = std::string("cuInit failed: ") + (text != nullptr ? text : "unknown CUDA error");
  }
  return driver;
}

/* The driver table, opened once per library (a function-local static: C++11 makes its first
 * initialisation thread-safe). Not std::call_once with a lambda: that instantiates a libstdc++
 * template (std::once_flag::_Prepare_execution<...>::_FUN) that is exported however the library is
 * built, so a kernel library loaded into a process whose libtessera_rt already holds this header
 * had its call_once run the runtime's lambda, which filled the runtime's table and left the
 * library's empty: a null cuDeviceGetCount, and a segfault at a C host's first tsrLaunch of a CUDA
 * image (seen on an H200, 2026-11-26; tests/runtime/test_tsr.py reproduces it with a stand-in
 * libcuda, no GPU needed). */
inline const Driver& GetDriver() {
  static const Driver driver = OpenDriver();
  return driver;
}

/* "<what> failed: <the driver's text for status>". */
inline std::string Describe(const char* what, CUresult status) {
  const char* text = nullptr;
  const Driver& driver = GetDriver();
  if (driver.cuGetErrorString != nullptr) driver.cuGetErrorString(status, &text);
  char code[32];
  std::snprintf(code, sizeof(code), " (CUresult %d)", static_cast<int>(status));
  return std::string(what) + " failed: " + (text != nullptr ? text : "unknown CUDA error") + code;
}

/* The primary context of ``device`` (the one torch uses), retained once per process. "" on success. */
inline std::string PrimaryContext(int device, CUcontext* out) {
  static std::mutex mu;
  static CUcontext contexts[64] = {};
  const Driver& driver = GetDriver();
  if (!driver.error.empty()) return driver.error;
  int count = 0;
  CUresult status = driver.cuDeviceGetCount(&count);
  if (status != CUDA_SUCCESS) return Describe("cuDeviceGetCount", status);
  if (device < 0 || device >= count || device >= 64) {
    return "CUDA device " + std::to_string(device) + " does not exist (this machine has " + std::to_string(count) +
           ")";
  }
  std::lock_guard<std::mutex> lock(mu);
  if (contexts[device] == nullptr) {
    CUdevice handle = 0;
    status = driver.cuDeviceGet(&handle, device);
    if (status != CUDA_SUCCESS) return Describe("cuDeviceGet", status);
    status = driver.cuDevicePrimaryCtxRetain(&contexts[device], handle);
    if (status != CUDA_SUCCESS) return Describe("cuDevicePrimaryCtxRetain", status);
  }
  *out = contexts[device];
  return "";
}

/* Makes the primary context of a device current until it goes out of scope. */
class ContextGuard {
 public:
  ContextGuard() = default;
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  ~ContextGuard() {
    if (pushed_) {
      CUcontext popped = nullptr;
      GetDriver().cuCtxPopCurrent(&popped);
    }
  }
  /* "" on success, else what failed. */
  std::string Enter(int device) {
    CUcontext context = nullptr;
    std::string error = PrimaryContext(device, &context);
    if (!error.empty()) return error;
    CUresult status = GetDriver().cuCtxPushCurrent(context);
    if (status != CUDA_SUCCESS) return Describe("cuCtxPushCurrent", status);
    pushed_ = true;
    return "";
  }

 private:
  bool pushed_ = false;
};

#undef TESSERA_CU_FUNCTIONS

}  // namespace cuda
}  // namespace tessera

#endif  /* TESSERA_CUDA_DRIVER_H_ */
