#include "base/library_pin.h"

#include <dlfcn.h>

namespace softrdma::base {

std::string pin_object_containing(const void* addr) {
  Dl_info info{};
  if (::dladdr(addr, &info) == 0 || !info.dli_fname) return "no shared object contains it";
  if (!::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
    const char* e = ::dlerror();
    return std::string(info.dli_fname) + ": " + (e ? e : "dlopen failed");
  }
  return "";
}

}  // namespace softrdma::base
