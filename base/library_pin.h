// Keeping a shared library mapped after a dlclose (RTLD_NODELETE, as `-z nodelete`).
#pragma once

#include <string>

namespace softrdma::base {

/// Keeps the shared object that contains `addr` (an address of code or data in it; pass one
/// with internal linkage, so that symbol interposition cannot resolve it to another object)
/// mapped for the rest of the process: it is opened again with RTLD_NOLOAD | RTLD_NODELETE,
/// so that a later dlclose leaves it in place. For libraries whose threads (progress, CM)
/// run their code while a program may dlclose them (Open MPI's MPI_Finalize unloads
/// libfabric, and with it librdmacm.so.1 and libibverbs.so.1; docs/rdma-cm.md, "Unloading").
/// Returns "" on success, else why not (dladdr found no object, or dlerror's text).
std::string pin_object_containing(const void* addr);

}  // namespace softrdma::base
