// Tessera's embeddable runtime (include/tessera/tsr.h): the seed's C ABI over tvm-ffi's C API.
//
// An image (<kernel>.tsrb, written by tessera_tvm.target.tsr.write_image) is
//
//   "TSRB" | u32 abi_major | u32 abi_minor | u64 n | n bytes of metadata text | u64 m | m bytes of library
//
// (little-endian). The metadata text lists the kernel, its arguments and its launch:
//
//   kernel <name> <entry symbol> <nargs>
//   arg <index> <name> <input|output> <DLPack code> <bits> <ndim> <dims...>
//   launch <gx> <gy> <gz> <bx> <by> <bz> <smem>      (or: launch none)
//
// The library is the tvm-ffi library `tessera export` builds; it is loaded from memory (memfd) and
// its entry called with the DLTensor arguments as TVMFFIAny values. Every handle is checked against
// the set of live handles under one lock, so stale or foreign handles are errors, not crashes.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <tessera/tsr.h>

#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <sys/mman.h>
#include <tvm/ffi/c_api.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <vector>

struct tsr_module;

struct tsr_kernel {
  tsr_module* module = nullptr;
  std::string name;
  TVMFFISafeCallType entry = nullptr;
  std::vector<std::string> arg_names;
  bool has_launch = false;
  tsr_launch_t launch{};
};

struct tsr_context {
  std::set<void*> allocations;
  std::vector<tsr_module*> modules;
};

struct tsr_module {
  tsr_context* context = nullptr;
  void* library = nullptr;
  int fd = -1;
  std::vector<std::unique_ptr<tsr_kernel>> kernels;
};

namespace {

constexpr size_t kMaxArgs = 1024;
constexpr int kMaxDims = 16;

thread_local std::string last_error;
std::mutex mu;                 // every call holds it: handles are checked and used under one lock
std::set<const void*> live;    // contexts, modules and kernels not destroyed yet

tsr_status_t Fail(tsr_status_t status, const std::string& message) {
  last_error = message;
  return status;
}

tsr_status_t Ok() {
  last_error.clear();
  return TSR_SUCCESS;
}

bool Live(const void* handle) { return handle != nullptr && live.count(handle) != 0; }

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

void Unload(tsr_module* mod) {
  for (auto& kernel : mod->kernels) live.erase(kernel.get());
  live.erase(mod);
  if (mod->library != nullptr) dlclose(mod->library);
  if (mod->fd >= 0) close(mod->fd);
  delete mod;
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
      void* entry = dlsym(mod->library, symbol.c_str());
      if (entry == nullptr) {
        return Fail(TSR_EINVAL, "tsrLoadModule: the image's library has no entry " + symbol);
      }
      mod->kernels.push_back(std::make_unique<tsr_kernel>());
      kernel = mod->kernels.back().get();
      kernel->module = mod;
      kernel->name = name;
      kernel->entry = reinterpret_cast<TVMFFISafeCallType>(entry);
    } else if (what == "arg" && kernel != nullptr) {
      size_t index = 0;
      std::string name, role;
      int code = 0, bits = 0, ndim = 0;
      if (!(words >> index >> name >> role >> code >> bits >> ndim) || index != kernel->arg_names.size() ||
          ndim < 0 || ndim > kMaxDims) {
        return Fail(TSR_EINVAL, "tsrLoadModule: image metadata has a malformed arg line: " + line);
      }
      kernel->arg_names.push_back(name);
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

}  // namespace

extern "C" {

const char* tsrGetLastError(void) { return last_error.c_str(); }

int tsrGetAbiVersion(void) { return TSR_ABI_MAJOR * 1000 + TSR_ABI_MINOR; }

tsr_status_t tsrCreateContext(tsr_context_t* ctx) {
  if (ctx == nullptr) return Fail(TSR_EINVAL, "tsrCreateContext: ctx is NULL");
  std::lock_guard<std::mutex> lock(mu);
  tsr_context* created = new (std::nothrow) tsr_context();
  if (created == nullptr) return Fail(TSR_EOOM, "tsrCreateContext: out of memory");
  live.insert(created);
  *ctx = created;
  return Ok();
}

tsr_status_t tsrDestroyContext(tsr_context_t ctx) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(ctx)) return Fail(TSR_EINVAL, "tsrDestroyContext: not a live context (destroyed already?)");
  for (tsr_module* mod : ctx->modules) Unload(mod);
  for (void* ptr : ctx->allocations) std::free(ptr);
  live.erase(ctx);
  delete ctx;
  return Ok();
}

tsr_status_t tsrLoadModule(tsr_context_t ctx, const void* image, size_t size, tsr_module_t* mod) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(ctx)) return Fail(TSR_EINVAL, "tsrLoadModule: not a live context");
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
  if (status != TSR_SUCCESS) {
    std::string message = last_error;
    dlclose(loaded->library);
    close(loaded->fd);
    loaded->library = nullptr;
    loaded->fd = -1;
    return Fail(status, message);
  }
  tsr_module* module = loaded.release();
  live.insert(module);
  for (auto& kernel : module->kernels) live.insert(kernel.get());
  ctx->modules.push_back(module);
  *mod = module;
  return Ok();
}

tsr_status_t tsrUnloadModule(tsr_module_t mod) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(mod)) return Fail(TSR_EINVAL, "tsrUnloadModule: not a live module");
  auto& modules = mod->context->modules;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (modules[i] == mod) {
      modules.erase(modules.begin() + static_cast<long>(i));
      break;
    }
  }
  Unload(mod);
  return Ok();
}

tsr_status_t tsrGetKernel(tsr_module_t mod, const char* name, tsr_kernel_t* kernel) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(mod)) return Fail(TSR_EINVAL, "tsrGetKernel: not a live module");
  if (name == nullptr || kernel == nullptr) return Fail(TSR_EINVAL, "tsrGetKernel: name or kernel is NULL");
  std::string names;
  for (auto& k : mod->kernels) {
    if (k->name == name) {
      *kernel = k.get();
      return Ok();
    }
    names += (names.empty() ? "" : ", ") + k->name;
  }
  return Fail(TSR_ENOTFOUND, std::string("tsrGetKernel: no kernel '") + name + "' in the module; it has " + names);
}

tsr_status_t tsrGetKernelNumArgs(tsr_kernel_t kernel, int32_t* nargs) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(kernel) || nargs == nullptr) return Fail(TSR_EINVAL, "tsrGetKernelNumArgs: not a live kernel, or NULL");
  *nargs = static_cast<int32_t>(kernel->arg_names.size());
  return Ok();
}

tsr_status_t tsrAlloc(tsr_context_t ctx, size_t bytes, void** ptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(ctx)) return Fail(TSR_EINVAL, "tsrAlloc: not a live context");
  if (ptr == nullptr || bytes == 0) return Fail(TSR_EINVAL, "tsrAlloc: ptr is NULL or bytes is 0");
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded < bytes) return Fail(TSR_EOOM, "tsrAlloc: " + std::to_string(bytes) + " bytes is too many");
  void* memory = std::aligned_alloc(64, rounded);
  if (memory == nullptr) return Fail(TSR_EOOM, "tsrAlloc: out of memory for " + std::to_string(bytes) + " bytes");
  ctx->allocations.insert(memory);
  *ptr = memory;
  return Ok();
}

tsr_status_t tsrFree(tsr_context_t ctx, void* ptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(ctx)) return Fail(TSR_EINVAL, "tsrFree: not a live context");
  if (ctx->allocations.erase(ptr) == 0) {
    return Fail(TSR_EINVAL, "tsrFree: the pointer was not allocated by this context with tsrAlloc (or was freed)");
  }
  std::free(ptr);
  return Ok();
}

tsr_status_t tsrLaunch(tsr_kernel_t kernel, tsr_stream_t stream, tsr_launch_t launch, void** args, int32_t nargs) {
  std::lock_guard<std::mutex> lock(mu);
  if (!Live(kernel)) return Fail(TSR_EINVAL, "tsrLaunch: not a live kernel (its module or context was destroyed?)");
  if (stream != nullptr) return Fail(TSR_EINVAL, "tsrLaunch: CPU kernels run on the default stream: pass NULL");
  size_t expected = kernel->arg_names.size();
  if (nargs < 0 || static_cast<size_t>(nargs) != expected) {
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
    std::memset(&packed[i], 0, sizeof(TVMFFIAny));
    packed[i].type_index = kTVMFFIDLTensorPtr;
    packed[i].v_ptr = args[i];
  }
  TVMFFIAny result;
  std::memset(&result, 0, sizeof(result));
  if (kernel->entry(nullptr, packed.data(), static_cast<int32_t>(expected), &result) != 0) {
    std::string error = RaisedError();
    bool bad_input = error.rfind("ValueError", 0) == 0 || error.rfind("TypeError", 0) == 0;
    return Fail(bad_input ? TSR_EINVAL : TSR_EKERNEL, "tsrLaunch: " + error);
  }
  return Ok();
}

}  // extern "C"
