/* Tessera's embeddable runtime: the C ABI of seed 004 §3.5 (libtessera_rt.so).
 *
 * A C or C++ host runs an exported Tessera kernel without Python:
 *
 *   tsr_context_t ctx;  tsrCreateContext(&ctx);
 *   tsr_module_t mod;   tsrLoadModule(ctx, image, image_size, &mod);   // <kernel>.tsrb, in memory
 *   tsr_kernel_t k;     tsrGetKernel(mod, "linear_relu", &k);
 *   void* args[] = {&A, &W, &b, &out};                                  // DLTensor*, inputs then outputs
 *   tsr_launch_t launch = {0};                                          // zero: as compiled
 *   tsrLaunch(k, NULL, launch, args, 4);
 *   tsrDestroyContext(ctx);                                             // frees its modules, streams, memory
 *
 * An image is data until it is launched: tsrLoadModule checks its SHA-256 (over all its other bytes)
 * before it reads its metadata or maps its library, and takes the entry only from that library
 * itself. A valid image runs its library's code when loaded and launched, like a cubin: load images
 * from builds you trust (the digest catches damage, not a forger).
 *
 * Every call returns a status; on failure tsrGetLastError() says what was wrong (per thread).
 * Handles are numbers the runtime looks up on every call, never reused: a handle of a destroyed
 * context, module, kernel or stream, a handle of the wrong kind, or a pointer tsrAlloc did not
 * return is TSR_EINVAL, never a crash.
 *
 * CPU images (`tessera export --target cpu`) run synchronously on the calling thread; their stream
 * must be NULL. CUDA images (`--target hopper|ampere`) run on the context's CUDA device (0, or the
 * one given to tsrCreateContextOnDevice) through the CUDA driver API: arguments are DLTensors of
 * kDLCUDA memory (tsrAlloc with TSR_ALLOC_DEVICE), launches are asynchronous on the stream (NULL:
 * the device's default stream), tsrMemcpy and tsrSynchronize wait for them.
 */
#ifndef TESSERA_TSR_H_
#define TESSERA_TSR_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. An image records the ABI it was built for; tsrLoadModule refuses
 * another major version, and a minor version newer than the runtime's. */
#define TSR_ABI_MAJOR 3
#define TSR_ABI_MINOR 0

typedef struct tsr_context* tsr_context_t;
typedef struct tsr_module* tsr_module_t;
typedef struct tsr_kernel* tsr_kernel_t;
typedef struct tsr_stream* tsr_stream_t;

typedef enum {
  TSR_SUCCESS = 0,
  TSR_EOOM = 1,       /* out of memory */
  TSR_EINVAL = 2,     /* a bad argument: handle, image, name, count, tensor, launch spec */
  TSR_ETIMEOUT = 3,   /* reserved: no call waits with a deadline yet */
  TSR_EABI = 4,       /* the image was built for another ABI version */
  TSR_ENOTFOUND = 5,  /* no kernel of that name in the module */
  TSR_EKERNEL = 6,    /* the kernel itself failed */
  TSR_ENODEVICE = 7   /* the image needs a device this machine (or this build of the runtime) does not have */
} tsr_status_t;

/* tsrAlloc flags: where the memory lives. */
#define TSR_ALLOC_HOST 0u   /* host memory, 64-byte aligned: what CPU kernels take */
#define TSR_ALLOC_DEVICE 1u /* memory of the context's CUDA device: what CUDA kernels take */

/* The launch spec: grid and block per dimension and dynamic shared memory in bytes. All zero means
 * "as compiled"; otherwise it must equal the kernel's metadata (its one device kernel's launch). */
typedef struct {
  uint32_t grid_x, grid_y, grid_z;
  uint32_t block_x, block_y, block_z;
  uint32_t smem_bytes;
} tsr_launch_t;

/* The message of this thread's last failed call ("" when none failed). */
const char* tsrGetLastError(void);

/* The runtime's ABI version (TSR_ABI_MAJOR * 1000 + TSR_ABI_MINOR). */
int tsrGetAbiVersion(void);

/* A context on the CPU and CUDA device 0 (the GPU is touched only when CUDA work is asked for). */
tsr_status_t tsrCreateContext(tsr_context_t* ctx);
/* A context whose CUDA work runs on CUDA device `cuda_device`. */
tsr_status_t tsrCreateContextOnDevice(int32_t cuda_device, tsr_context_t* ctx);
tsr_status_t tsrDestroyContext(tsr_context_t ctx);

tsr_status_t tsrLoadModule(tsr_context_t ctx, const void* image, size_t size, tsr_module_t* mod);
tsr_status_t tsrUnloadModule(tsr_module_t mod);
tsr_status_t tsrGetKernel(tsr_module_t mod, const char* name, tsr_kernel_t* kernel);
/* How many arguments the kernel takes (inputs then outputs). */
tsr_status_t tsrGetKernelNumArgs(tsr_kernel_t kernel, size_t* nargs);

/* `flags`: TSR_ALLOC_HOST or TSR_ALLOC_DEVICE. */
tsr_status_t tsrAlloc(tsr_context_t ctx, size_t bytes, uint32_t flags, void** dptr);
tsr_status_t tsrFree(tsr_context_t ctx, void* dptr);
/* Copies `bytes` between any two of host memory and the context's device memory (waits for the
 * device's default stream). A range past the end of a tsrAlloc block is TSR_EINVAL. */
tsr_status_t tsrMemcpy(tsr_context_t ctx, void* dst, const void* src, size_t bytes);

/* A CUDA stream of the context's device. */
tsr_status_t tsrCreateStream(tsr_context_t ctx, tsr_stream_t* stream);
tsr_status_t tsrDestroyStream(tsr_stream_t stream);
/* Waits for the work on `stream` (NULL: all of the context's device work). */
tsr_status_t tsrSynchronize(tsr_context_t ctx, tsr_stream_t stream);

/* args[i] is a DLTensor* (dlpack.h) of the dtype and shape the kernel was compiled for, dense
 * row-major, in the memory its image runs on. Outputs are written in place. An argument of another
 * dtype or rank than the image's metadata says is TSR_EINVAL, and the message names both. */
tsr_status_t tsrLaunch(tsr_kernel_t kernel, tsr_stream_t stream, tsr_launch_t launch, void** args, size_t nargs);

#ifdef __cplusplus
}
#endif

#endif /* TESSERA_TSR_H_ */
