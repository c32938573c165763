// Tessera's embeddable runtime (include/tessera/tsr.h): the seed's C ABI over tvm-ffi's C API and,
// for CUDA images, the CUDA driver API (tessera/cuda_driver.h; built in when TSR_WITH_CUDA is defined).
//
// An image (<kernel>.tsrb, written by tessera_tvm.target.tsr.write_image) is
//
//   "TSRB" | u32 abi_major | u32 abi_minor | 32-byte SHA-256 | u64 n | n bytes of metadata text | u64 m |
//   m bytes of library
//
// (little-endian). The SHA-256 covers every byte of the image but its own 32: tsrLoadModule checks it
// before it reads the metadata or maps the library, so a corrupt or edited image is refused, not run. The metadata text lists the kernel, the device it runs on, its arguments and its launch:
//
//   kernel <name> <entry symbol> <nargs>
//   device <cpu|cuda>
//   arg <index> <name> <input|output> <DLPack code> <bits> <ndim> <dims...>
//   launch <gx> <gy> <gz> <bx> <by> <bz> <smem>      (or: launch none)
//
// The library is the tvm-ffi library `tessera export` builds; it is loaded from memory (memfd), its
// entry looked up in that library alone (never in what it links), and called with the DLTensor arguments as TVMFFIAny values (a CUDA library launches its own
// kernels on the stream tvm-ffi's environment names, which tsrLaunch sets). Handles are numbers
// looked up under one lock and never reused, so a stale, foreign or mistyped handle is an error.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <tessera/tsr.h>

#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <link.h>
#include <sys/mman.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef TSR_WITH_CUDA
#include <tessera/cuda_driver.h>
#endif

struct tsr_context;
struct tsr_module;

struct tsr_kernel {
  tsr_module* module = nullptr;
  uintptr_t id = 0;
  std::string name;
  TVMFFISafeCallType entry = nullptr;
  std::vector<std::string> arg_names;
  std::vector<DLDataType> arg_types;  // what the image's metadata says each argument is
  std::vector<int> arg_ndims;
  bool has_launch = false;
  tsr_launch_t launch{};
};

struct tsr_module {
  tsr_context* context = nullptr;
  uintptr_t id = 0;
  bool cuda = false;
  void* library = nullptr;
  int fd = -1;
  std::vector<std::unique_ptr<tsr_kernel>> kernels;
};

struct tsr_stream {
  tsr_context* context = nullptr;
  uintptr_t id = 0;
  void* stream = nullptr;  // a CUstream
};

struct tsr_context {
  uintptr_t id = 0;
  int device = 0;                          // its CUDA device
  std::map<uintptr_t, size_t> host;        // tsrAlloc blocks: start -> bytes
  std::map<uintptr_t, size_t> device_mem;  // device blocks: start -> bytes
  std::vector<tsr_module*> modules;
  std::vector<tsr_stream*> streams;
};

namespace {

constexpr size_t kMaxArgs = 1024;
constexpr int kMaxDims = 16;

enum class Kind { kContext, kModule, kKernel, kStream };

thread_local std::string last_error;
std::mutex mu;  // every call holds it: handles are looked up and used under one lock
std::unordered_map<uintptr_t, std::pair<Kind, void*>> handles;  // live handles: id -> (kind, object)
uintptr_t next_id = 0x75720000;                                 // ids grow by 16 and are never reused

tsr_status_t Fail(tsr_status_t status, const std::string& message) {
  last_error = message;
  return status;
}

tsr_status_t Ok() {
  last_error.clear();
  return TSR_SUCCESS;
}

template <typename T>
T* Register(T* object, Kind kind) {
  next_id += 16;
  object->id = next_id;
  handles[object->id] = {kind, object};
  return reinterpret_cast<T*>(object->id);  // what the caller holds: a number, not the object's address
}

template <typename T>
T* Find(const void* handle, Kind kind) {
  auto found = handles.find(reinterpret_cast<uintptr_t>(handle));
  if (found == handles.end() || found->second.first != kind) return nullptr;
  return static_cast<T*>(found->second.second);
}

// Reads the image's fields in order; any read past the end marks it truncated.
struct Reader {
  const unsigned char* data;
  size_t size;
  size_t at = 0;
  bool ok = true;

  bool Take(size_t n, const unsigned char** out) {
    if (!ok || n > size - at) return ok = false;
    *out = data + at;
    at += n;
    return true;
  }
  uint64_t Uint(int bytes) {
    const unsigned char* p = nullptr;
    if (!Take(bytes, &p)) return 0;
    uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
    return value;
  }
};

// SHA-256 (FIPS 180-4), fed in pieces: the image digest needs no crypto library.
class Sha256 {
 public:
  void Update(const unsigned char* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      block_[fill_++] = data[i];
      if (fill_ == 64) {
        Compress();
        fill_ = 0;
      }
    }
    bytes_ += size;
  }
  void Finish(unsigned char out[32]) {
    uint64_t bits = bytes_ * 8;
    unsigned char pad = 0x80;
    Update(&pad, 1);
    pad = 0;
    while (fill_ != 56) Update(&pad, 1);
    for (int i = 7; i >= 0; --i) {
      unsigned char b = static_cast<unsigned char>(bits >> (8 * i));
      Update(&b, 1);
    }
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<unsigned char>(state_[i] >> (24 - 8 * j));
    }
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void Compress() {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{block_[4 * i]} << 24) | (uint32_t{block_[4 * i + 1]} << 16) |
             (uint32_t{block_[4 * i + 2]} << 8) | uint32_t{block_[4 * i + 3]};
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t v[8];
    for (int i = 0; i < 8; ++i) v[i] = state_[i];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = v[7] + (Rotr(v[4], 6) ^ Rotr(v[4], 11) ^ Rotr(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) + k[i] + w[i];
      uint32_t t2 = (Rotr(v[0], 2) ^ Rotr(v[0], 13) ^ Rotr(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
      for (int j = 7; j > 0; --j) v[j] = v[j - 1];
      v[4] += t1;
      v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; ++i) state_[i] += v[i];
  }

  uint32_t state_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char block_[64] = {};
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

// A DLPack dtype in words ("float32", "bfloat16", "int8x4", "code 9 bits 8").
std::string DtypeName(DLDataType t) {
  const char* names[] = {"int", "uint", "float", nullptr, "bfloat"};
  std::string name = t.code < 5 && names[t.code] != nullptr
                         ? std::string(names[t.code]) + std::to_string(t.bits)
                         : "(DLPack code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ")";
  return t.lanes == 1 ? name : name + "x" + std::to_string(t.lanes);
}

// CUDA, when built in: "" on success, else why not.
std::string CudaError() {
#ifdef TSR_WITH_CUDA
  return tessera::cuda::GetDriver().error;
#else
  return "this libtessera_rt was built without CUDA (no CUDA headers where it was built)";
#endif
}

#ifdef TSR_WITH_CUDA
namespace cu = tessera::cuda;

// Enters the context's device for the rest of the scope; "" on success.
#define TSR_ENTER_DEVICE(ctx, where)                                            \
  cu::ContextGuard guard_;                                                      \
  {                                                                             \
    std::string error_ = guard_.Enter((ctx)->device);                           \
    if (!error_.empty()) return Fail(TSR_ENODEVICE, std::string(where) + ": " + error_); \
  }
#endif

// Drops ``item`` from its context's list (a module unloaded or a stream destroyed before the context).
template <typename T>
void Forget(std::vector<T*>& items, T* item) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i] == item) {
      items.erase(items.begin() + static_cast<long>(i));
      return;
    }
  }
}

void Unload(tsr_module* mod) {
  for (auto& kernel : mod->kernels) handles.erase(kernel->id);
  handles.erase(mod->id);
  if (mod->library != nullptr) dlclose(mod->library);
  if (mod->fd >= 0) close(mod->fd);
  delete mod;
}

void DestroyStream(tsr_stream* stream) {
#ifdef TSR_WITH_CUDA
  if (stream->stream != nullptr) cu::GetDriver().cuStreamDestroy(static_cast<CUstream>(stream->stream));
#endif
  handles.erase(stream->id);
  delete stream;
}

tsr_status_t ParseMetadata(const std::string& text, tsr_module* mod) {
  std::istringstream lines(text);
  std::string line;
  tsr_kernel* kernel = nullptr;
  size_t nargs = 0;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string what;
    if (!(words >> what)) continue;
    if (what == "kernel") {
      std::string name, symbol;
      if (!(words >> name >> symbol >> nargs) || nargs > kMaxArgs) {
        return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has a malformed kernel line: " + line);
      }
      if (symbol.rfind("__tvm_ffi_", 0) != 0) {
        return Fail(TSR_EINVAL, "tsrLoadModule: image metadata names entry " + symbol +
                                    "; expected a tvm-ffi entry (__tvm_ffi_<kernel>)");
      }
      // dlsym searches the library's dependencies too: the entry must be defined by the library itself.
      void* entry = dlsym(mod->library, symbol.c_str());
      struct link_map* own = nullptr;
      struct link_map* found = nullptr;
      Dl_info info;
      if (entry == nullptr || dlinfo(mod->library, RTLD_DI_LINKMAP, &own) != 0 ||
          dladdr1(entry, &info, reinterpret_cast<void**>(&found), RTLD_DL_LINKMAP) == 0 || found != own) {
        return Fail(TSR_EINVAL, "tsrLoadModule: the image's library defines no entry " + symbol);
      }
      mod->kernels.push_back(std::make_unique<tsr_kernel>());
      kernel = mod->kernels.back().get();
      kernel->module = mod;
      kernel->name = name;
      kernel->entry = reinterpret_cast<TVMFFISafeCallType>(entry);
    } else if (what == "device") {
      std::string device;
      if (!(words >> device) || (device != "cpu" && device != "cuda")) {
        return Fail(TSR_EINVAL, "tsrLoadModule: image metadata names an unknown device: " + line);
      }
      mod->cuda = device == "cuda";
    } else if (what == "arg" && kernel != nullptr) {
      size_t index = 0;
      std::string name, role;
      int code = 0, bits = 0, ndim = 0;
      if (!(words >> index >> name >> role >> code >> bits >> ndim) || index != kernel->arg_names.size() ||
          ndim < 0 || ndim > kMaxDims) {
        return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has a malformed arg line: " + line);
      }
      if (code < 0 || code > 255 || bits <= 0 || bits > 255) {
        return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has a malformed arg dtype: " + line);
      }
      kernel->arg_names.push_back(name);
      kernel->arg_types.push_back(DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1});
      kernel->arg_ndims.push_back(ndim);
    } else if (what == "launch" && kernel != nullptr) {
      std::string first;
      if (!(words >> first)) return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has an empty launch line");
      if (first != "none") {
        tsr_launch_t& l = kernel->launch;
        std::istringstream all(line.substr(line.find(first)));
        if (!(all >> l.grid_x >> l.grid_y >> l.grid_z >> l.block_x >> l.block_y >> l.block_z >> l.smem_bytes)) {
          return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has a malformed launch line: " + line);
        }
        kernel->has_launch = true;
      }
    } else {
      return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has an unexpected line: " + line);
    }
  }
  if (kernel == nullptr) return Fail(TSR_EINVAL, "tsrLoadModule: image metadata names no kernel");
  if (kernel->arg_names.size() != nargs) {
    return Fail(TSR_EINVAL, "tsrLoadModule: image metadata lists " + std::to_string(kernel->arg_names.size()) +
                                " arguments for " + kernel->name + ", which takes " + std::to_string(nargs));
  }
  return Ok();
}

std::string RaisedError() {
  TVMFFIObjectHandle error = nullptr;
  TVMFFIErrorMoveFromRaised(&error);
  if (error == nullptr) return "unknown error";
  TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(error);
  std::string text = std::string(cell->kind.data, cell->kind.size) + ": " +
                     std::string(cell->message.data, cell->message.size);
  TVMFFIObjectDecRef(error);
  return text;
}

bool IsZero(const tsr_launch_t& l) {
  return l.grid_x == 0 && l.grid_y == 0 && l.grid_z == 0 && l.block_x == 0 && l.block_y == 0 && l.block_z == 0 &&
         l.smem_bytes == 0;
}

std::string Describe(const tsr_launch_t& l) {
  std::ostringstream out;
  out << "grid [" << l.grid_x << ", " << l.grid_y << ", " << l.grid_z << "] block [" << l.block_x << ", "
      << l.block_y << ", " << l.block_z << "] smem " << l.smem_bytes;
  return out.str();
}

// The tsrAlloc block of `blocks` holding [ptr, ptr + bytes): 1 if inside one, 0 if in none, -1 if it
// starts inside one and runs past its end.
int Within(const std::map<uintptr_t, size_t>& blocks, const void* ptr, size_t bytes) {
  uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
  auto next = blocks.upper_bound(at);
  if (next == blocks.begin()) return 0;
  --next;
  if (at >= next->first + next->second) return 0;
  return bytes <= next->first + next->second - at ? 1 : -1;
}

tsr_status_t CreateContext(int32_t device, tsr_context_t* ctx, const char* where) {
  if (ctx == nullptr) return Fail(TSR_EINVAL, std::string(where) + ": ctx is NULL");
  if (device < 0) return Fail(TSR_EINVAL, std::string(where) + ": CUDA device " + std::to_string(device) + " < 0");
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* created = new (std::nothrow) tsr_context();
  if (created == nullptr) return Fail(TSR_EOOM, std::string(where) + ": out of memory");
  created->device = device;
  *ctx = Register(created, Kind::kContext);
  return Ok();
}

}  // namespace

extern "C" {

const char* tsrGetLastError(void) { return last_error.c_str(); }

int tsrGetAbiVersion(void) { return TSR_ABI_MAJOR * 1000 + TSR_ABI_MINOR; }

tsr_status_t tsrCreateContext(tsr_context_t* ctx) { return CreateContext(0, ctx, "tsrCreateContext"); }

tsr_status_t tsrCreateContextOnDevice(int32_t cuda_device, tsr_context_t* ctx) {
  return CreateContext(cuda_device, ctx, "tsrCreateContextOnDevice");
}

tsr_status_t tsrDestroyContext(tsr_context_t handle) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrDestroyContext: not a live context (destroyed already?)");
  for (tsr_module* mod : ctx->modules) Unload(mod);
  for (tsr_stream* stream : ctx->streams) DestroyStream(stream);
  for (auto& block : ctx->host) std::free(reinterpret_cast<void*>(block.first));
#ifdef TSR_WITH_CUDA
  if (!ctx->device_mem.empty()) {
    cu::ContextGuard guard;
    if (guard.Enter(ctx->device).empty()) {
      for (auto& block : ctx->device_mem) cu::GetDriver().cuMemFree(static_cast<CUdeviceptr>(block.first));
    }
  }
#endif
  handles.erase(ctx->id);
  delete ctx;
  return Ok();
}

tsr_status_t tsrLoadModule(tsr_context_t handle, const void* image, size_t size, tsr_module_t* mod) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrLoadModule: not a live context");
  if (image == nullptr || mod == nullptr) return Fail(TSR_EINVAL, "tsrLoadModule: image or mod is NULL");
  Reader in{static_cast<const unsigned char*>(image), size};
  const unsigned char* magic = nullptr;
  if (!in.Take(4, &magic) || std::memcmp(magic, "TSRB", 4) != 0) {
    return Fail(TSR_EINVAL, "tsrLoadModule: not a Tessera image (no TSRB header); expected a <kernel>.tsrb file");
  }
  uint64_t major = in.Uint(4), minor = in.Uint(4);
  if (!in.ok) return Fail(TSR_EINVAL, "tsrLoadModule: the image is truncated (in its header)");
  if (major != TSR_ABI_MAJOR || minor > TSR_ABI_MINOR) {
    return Fail(TSR_EABI, "tsrLoadModule: the image needs ABI " + std::to_string(major) + "." + std::to_string(minor) +
                              "; this runtime has ABI " + std::to_string(TSR_ABI_MAJOR) + "." +
                              std::to_string(TSR_ABI_MINOR));
  }
  const unsigned char* digest = nullptr;
  if (!in.Take(32, &digest)) return Fail(TSR_EINVAL, "tsrLoadModule: the image is truncated (in its digest)");
  unsigned char actual[32];
  Sha256 sha;
  sha.Update(in.data, 12);
  sha.Update(in.data + in.at, size - in.at);
  sha.Finish(actual);
  if (std::memcmp(actual, digest, 32) != 0) {
    return Fail(TSR_EINVAL,
                "tsrLoadModule: the image does not match its SHA-256 (corrupt or edited); expected the bytes "
                "`tessera export` wrote");
  }
  uint64_t meta_size = in.Uint(8);
  const unsigned char* meta = nullptr;
  if (!in.ok || !in.Take(meta_size, &meta)) return Fail(TSR_EINVAL, "tsrLoadModule: the image is truncated (metadata)");
  uint64_t lib_size = in.Uint(8);
  const unsigned char* lib = nullptr;
  if (!in.ok || !in.Take(lib_size, &lib)) return Fail(TSR_EINVAL, "tsrLoadModule: the image is truncated (library)");
  if (in.at != size) return Fail(TSR_EINVAL, "tsrLoadModule: the image has trailing bytes after its library");

  std::unique_ptr<tsr_module> loaded(new (std::nothrow) tsr_module());
  if (!loaded) return Fail(TSR_EOOM, "tsrLoadModule: out of memory");
  loaded->context = ctx;
  loaded->fd = memfd_create("tessera_module", MFD_CLOEXEC);
  if (loaded->fd < 0) return Fail(TSR_EINVAL, "tsrLoadModule: memfd_create failed");
  for (uint64_t done = 0; done < lib_size;) {
    ssize_t n = write(loaded->fd, lib + done, lib_size - done);
    if (n <= 0) {
      close(loaded->fd);
      return Fail(TSR_EOOM, "tsrLoadModule: cannot stage the library in memory");
    }
    done += static_cast<uint64_t>(n);
  }
  std::string path = "/proc/self/fd/" + std::to_string(loaded->fd);
  loaded->library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (loaded->library == nullptr) {
    const char* why = dlerror();
    close(loaded->fd);
    return Fail(TSR_EINVAL, std::string("tsrLoadModule: the image's library does not load: ") + (why ? why : "?"));
  }
  tsr_status_t status = ParseMetadata(std::string(reinterpret_cast<const char*>(meta), meta_size), loaded.get());
  std::string cuda_error = status == TSR_SUCCESS && loaded->cuda ? CudaError() : "";
  if (status == TSR_SUCCESS && !cuda_error.empty()) {
    status = Fail(TSR_ENODEVICE, "tsrLoadModule: " + loaded->kernels[0]->name + " runs on CUDA, and " + cuda_error);
  }
  if (status != TSR_SUCCESS) {
    std::string message = last_error;
    dlclose(loaded->library);
    close(loaded->fd);
    loaded->library = nullptr;
    loaded->fd = -1;
    return Fail(status, message);
  }
  tsr_module* module = loaded.release();
  *mod = Register(module, Kind::kModule);
  for (auto& kernel : module->kernels) Register(kernel.get(), Kind::kKernel);
  ctx->modules.push_back(module);
  return Ok();
}

tsr_status_t tsrUnloadModule(tsr_module_t handle) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_module* mod = Find<tsr_module>(handle, Kind::kModule);
  if (mod == nullptr) return Fail(TSR_EINVAL, "tsrUnloadModule: not a live module");
  Forget(mod->context->modules, mod);
  Unload(mod);
  return Ok();
}

tsr_status_t tsrGetKernel(tsr_module_t handle, const char* name, tsr_kernel_t* kernel) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_module* mod = Find<tsr_module>(handle, Kind::kModule);
  if (mod == nullptr) return Fail(TSR_EINVAL, "tsrGetKernel: not a live module");
  if (name == nullptr || kernel == nullptr) return Fail(TSR_EINVAL, "tsrGetKernel: name or kernel is NULL");
  std::string names;
  for (auto& k : mod->kernels) {
    if (k->name == name) {
      *kernel = reinterpret_cast<tsr_kernel_t>(k->id);
      return Ok();
    }
    names += (names.empty() ? "" : ", ") + k->name;
  }
  return Fail(TSR_ENOTFOUND, std::string("tsrGetKernel: no kernel '") + name + "' in the module; it has " + names);
}

tsr_status_t tsrGetKernelNumArgs(tsr_kernel_t handle, size_t* nargs) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_kernel* kernel = Find<tsr_kernel>(handle, Kind::kKernel);
  if (kernel == nullptr || nargs == nullptr) return Fail(TSR_EINVAL, "tsrGetKernelNumArgs: not a live kernel, or NULL");
  *nargs = kernel->arg_names.size();
  return Ok();
}

tsr_status_t tsrAlloc(tsr_context_t handle, size_t bytes, uint32_t flags, void** ptr) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrAlloc: not a live context");
  if (ptr == nullptr || bytes == 0) return Fail(TSR_EINVAL, "tsrAlloc: ptr is NULL or bytes is 0");
  if (flags == TSR_ALLOC_HOST) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes) return Fail(TSR_EOOM, "tsrAlloc: " + std::to_string(bytes) + " bytes is too many");
    void* memory = std::aligned_alloc(64, rounded);
    if (memory == nullptr) return Fail(TSR_EOOM, "tsrAlloc: out of memory for " + std::to_string(bytes) + " bytes");
    ctx->host[reinterpret_cast<uintptr_t>(memory)] = bytes;
    *ptr = memory;
    return Ok();
  }
  if (flags != TSR_ALLOC_DEVICE) {
    return Fail(TSR_EINVAL, "tsrAlloc: flags " + std::to_string(flags) + " is neither TSR_ALLOC_HOST nor TSR_ALLOC_DEVICE");
  }
#ifdef TSR_WITH_CUDA
  TSR_ENTER_DEVICE(ctx, "tsrAlloc");
  CUdeviceptr memory = 0;
  CUresult status = cu::GetDriver().cuMemAlloc(&memory, bytes);
  if (status == CUDA_ERROR_OUT_OF_MEMORY) {
    return Fail(TSR_EOOM, "tsrAlloc: the CUDA device is out of memory for " + std::to_string(bytes) + " bytes");
  }
  if (status != CUDA_SUCCESS) return Fail(TSR_EINVAL, "tsrAlloc: " + cu::Describe("cuMemAlloc", status));
  ctx->device_mem[static_cast<uintptr_t>(memory)] = bytes;
  *ptr = reinterpret_cast<void*>(memory);
  return Ok();
#else
  return Fail(TSR_ENODEVICE, "tsrAlloc: TSR_ALLOC_DEVICE needs CUDA, and " + CudaError());
#endif
}

tsr_status_t tsrFree(tsr_context_t handle, void* ptr) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrFree: not a live context");
  uintptr_t at = reinterpret_cast<uintptr_t>(ptr);
  if (ctx->host.erase(at) != 0) {
    std::free(ptr);
    return Ok();
  }
#ifdef TSR_WITH_CUDA
  if (ctx->device_mem.count(at) != 0) {
    TSR_ENTER_DEVICE(ctx, "tsrFree");
    ctx->device_mem.erase(at);
    CUresult status = cu::GetDriver().cuMemFree(static_cast<CUdeviceptr>(at));
    if (status != CUDA_SUCCESS) return Fail(TSR_EINVAL, "tsrFree: " + cu::Describe("cuMemFree", status));
    return Ok();
  }
#endif
  return Fail(TSR_EINVAL, "tsrFree: the pointer was not allocated by this context with tsrAlloc (or was freed)");
}

tsr_status_t tsrMemcpy(tsr_context_t handle, void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrMemcpy: not a live context");
  if (dst == nullptr || src == nullptr) return Fail(TSR_EINVAL, "tsrMemcpy: dst or src is NULL");
  int dst_host = Within(ctx->host, dst, bytes), src_host = Within(ctx->host, src, bytes);
  int dst_dev = Within(ctx->device_mem, dst, bytes), src_dev = Within(ctx->device_mem, src, bytes);
  if (dst_host < 0 || src_host < 0 || dst_dev < 0 || src_dev < 0) {
    return Fail(TSR_EINVAL, "tsrMemcpy: " + std::to_string(bytes) + " bytes run past the end of a tsrAlloc block");
  }
  if (dst_dev == 0 && src_dev == 0) {
    std::memmove(dst, src, bytes);
    return Ok();
  }
#ifdef TSR_WITH_CUDA
  TSR_ENTER_DEVICE(ctx, "tsrMemcpy");
  CUresult status = cu::GetDriver().cuMemcpy(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes);
  if (status != CUDA_SUCCESS) return Fail(TSR_EKERNEL, "tsrMemcpy: " + cu::Describe("cuMemcpy", status));
  return Ok();
#else
  return Fail(TSR_ENODEVICE, "tsrMemcpy: " + CudaError());
#endif
}

tsr_status_t tsrCreateStream(tsr_context_t handle, tsr_stream_t* stream) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrCreateStream: not a live context");
  if (stream == nullptr) return Fail(TSR_EINVAL, "tsrCreateStream: stream is NULL");
#ifdef TSR_WITH_CUDA
  TSR_ENTER_DEVICE(ctx, "tsrCreateStream");
  CUstream created = nullptr;
  CUresult status = cu::GetDriver().cuStreamCreate(&created, CU_STREAM_NON_BLOCKING);
  if (status != CUDA_SUCCESS) return Fail(TSR_EINVAL, "tsrCreateStream: " + cu::Describe("cuStreamCreate", status));
  tsr_stream* object = new (std::nothrow) tsr_stream();
  if (object == nullptr) {
    cu::GetDriver().cuStreamDestroy(created);
    return Fail(TSR_EOOM, "tsrCreateStream: out of memory");
  }
  object->context = ctx;
  object->stream = created;
  ctx->streams.push_back(object);
  *stream = Register(object, Kind::kStream);
  return Ok();
#else
  return Fail(TSR_ENODEVICE, "tsrCreateStream: streams are CUDA streams, and " + CudaError());
#endif
}

tsr_status_t tsrDestroyStream(tsr_stream_t handle) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_stream* stream = Find<tsr_stream>(handle, Kind::kStream);
  if (stream == nullptr) return Fail(TSR_EINVAL, "tsrDestroyStream: not a live stream");
  Forget(stream->context->streams, stream);
  DestroyStream(stream);
  return Ok();
}

tsr_status_t tsrSynchronize(tsr_context_t handle, tsr_stream_t stream_handle) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* ctx = Find<tsr_context>(handle, Kind::kContext);
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrSynchronize: not a live context");
  tsr_stream* stream = nullptr;
  if (stream_handle != nullptr) {
    stream = Find<tsr_stream>(stream_handle, Kind::kStream);
    if (stream == nullptr || stream->context != ctx) {
      return Fail(TSR_EINVAL, "tsrSynchronize: not a live stream of this context");
    }
  }
#ifdef TSR_WITH_CUDA
  if (stream == nullptr && ctx->device_mem.empty()) return Ok();  // no device work can have been queued
  TSR_ENTER_DEVICE(ctx, "tsrSynchronize");
  const cu::Driver& driver = cu::GetDriver();
  CUresult status = stream != nullptr ? driver.cuStreamSynchronize(static_cast<CUstream>(stream->stream))
                                      : driver.cuCtxSynchronize();
  if (status != CUDA_SUCCESS) return Fail(TSR_EKERNEL, "tsrSynchronize: " + cu::Describe("synchronize", status));
#endif
  return Ok();  // CPU work has finished when tsrLaunch returns
}

tsr_status_t tsrLaunch(tsr_kernel_t handle, tsr_stream_t stream_handle, tsr_launch_t launch, void** args,
                       size_t nargs) {
  std::lock_guard<std::mutex> lock(mu);
  tsr_kernel* kernel = Find<tsr_kernel>(handle, Kind::kKernel);
  if (kernel == nullptr) return Fail(TSR_EINVAL, "tsrLaunch: not a live kernel (its module or context was destroyed?)");
  tsr_context* ctx = kernel->module->context;
  bool cuda = kernel->module->cuda;
  tsr_stream* stream = nullptr;
  if (stream_handle != nullptr) {
    if (!cuda) return Fail(TSR_EINVAL, "tsrLaunch: CPU kernels run on the default stream: pass NULL");
    stream = Find<tsr_stream>(stream_handle, Kind::kStream);
    if (stream == nullptr || stream->context != ctx) {
      return Fail(TSR_EINVAL, "tsrLaunch: not a live stream of the kernel's context");
    }
  }
  size_t expected = kernel->arg_names.size();
  if (nargs != expected) {
    return Fail(TSR_EINVAL, "tsrLaunch: " + kernel->name + " takes " + std::to_string(expected) + " arguments, got " +
                                std::to_string(nargs));
  }
  if (expected > 0 && args == nullptr) return Fail(TSR_EINVAL, "tsrLaunch: args is NULL");
  if (!IsZero(launch)) {
    const tsr_launch_t& want = kernel->launch;
    bool same = kernel->has_launch && launch.grid_x == want.grid_x && launch.grid_y == want.grid_y &&
                launch.grid_z == want.grid_z && launch.block_x == want.block_x && launch.block_y == want.block_y &&
                launch.block_z == want.block_z && launch.smem_bytes == want.smem_bytes;
    if (!same) {
      return Fail(TSR_EINVAL, "tsrLaunch: launch spec " + Describe(launch) + " contradicts " + kernel->name +
                                  "'s metadata (" + (kernel->has_launch ? Describe(want) : "several device kernels") +
                                  "); pass the metadata's spec or all zeros");
    }
  }
  std::vector<TVMFFIAny> packed(expected);
  for (size_t i = 0; i < expected; ++i) {
    if (args[i] == nullptr) {
      return Fail(TSR_EINVAL, "tsrLaunch: argument " + std::to_string(i) + " (" + kernel->arg_names[i] + ") is NULL");
    }
    const DLTensor* tensor = static_cast<const DLTensor*>(args[i]);
    const DLDataType want = kernel->arg_types[i];
    if (tensor->dtype.code != want.code || tensor->dtype.bits != want.bits || tensor->dtype.lanes != want.lanes) {
      return Fail(TSR_EINVAL, "tsrLaunch: argument " + kernel->arg_names[i] + " has dtype " +
                                  DtypeName(tensor->dtype) + "; " + kernel->name + " expects " + DtypeName(want));
    }
    if (tensor->ndim != kernel->arg_ndims[i]) {
      return Fail(TSR_EINVAL, "tsrLaunch: argument " + kernel->arg_names[i] + " has " + std::to_string(tensor->ndim) +
                                  " dims; " + kernel->name + " expects " + std::to_string(kernel->arg_ndims[i]));
    }
    if (cuda && tensor->device.device_type == kDLCUDA && tensor->device.device_id != ctx->device) {
      return Fail(TSR_EINVAL, "tsrLaunch: argument " + kernel->arg_names[i] + " is on CUDA device " +
                                  std::to_string(tensor->device.device_id) + "; the context runs on device " +
                                  std::to_string(ctx->device));
    }
    std::memset(&packed[i], 0, sizeof(TVMFFIAny));
    packed[i].type_index = kTVMFFIDLTensorPtr;
    packed[i].v_ptr = args[i];
  }
  TVMFFIStreamHandle previous = nullptr;
  if (cuda) {  // the library launches on the stream tvm-ffi's environment names for the device
    TVMFFIEnvSetStream(kDLCUDA, ctx->device, stream != nullptr ? stream->stream : nullptr, &previous);
  }
  TVMFFIAny result;
  std::memset(&result, 0, sizeof(result));
  int failed = kernel->entry(nullptr, packed.data(), static_cast<int32_t>(expected), &result);
  if (cuda) TVMFFIEnvSetStream(kDLCUDA, ctx->device, previous, nullptr);
  if (failed != 0) {
    std::string error = RaisedError();
    bool bad_input = error.rfind("ValueError", 0) == 0 || error.rfind("TypeError", 0) == 0;
    return Fail(bad_input ? TSR_EINVAL : TSR_EKERNEL, "tsrLaunch: " + error);
  }
  return Ok();
}

}  // extern "C"
