// Sharing a context, its PDs, MRs and DMs within a process (ibv_import_device(3),
// ibv_import_pd(3), ibv_import_mr(3), ibv_import_dm(3), rdma-core 44): a context's cmd_fd is a
// memfd whose inode names its "command file", the process-wide object a kernel uverbs file
// would be. ibv_import_device on a dup of that descriptor opens a context on the same file;
// the PDs, MRs and DMs of every context of a file are listed there by handle (ibv_pd::handle,
// ibv_mr::handle, ibv_dm::handle), so ibv_import_pd / ibv_import_mr / ibv_import_dm (dm.cpp)
// give new handles on the same objects.
//
// Between processes this cannot be done: a softrdma device is the engine of one process, at
// one address; another process's cmd_fd names no file of this one, and importing it fails
// as rdma-core fails for a descriptor of no verbs device (ENODEV).
//
// Lifetimes, as the kernel keeps objects in the file until they are destroyed: every handle
// holds the object; ibv_dealloc_pd / ibv_dereg_mr through any handle unlists it (it can no
// longer be imported) and drops that handle; ibv_unimport_* drops the handle only — when it
// was the last one, the file keeps the object until it is deallocated through a new import
// or the last context of the file is closed.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "verbs/ops.h"

using namespace softrdma;
using namespace softrdma::verbs;

namespace softrdma::verbs {

/// The objects of one kind a command file lists by handle: weak (the handles own them), and
/// `kept` those whose last handle was unimported. An entry goes at ibv_dealloc_pd /
/// ibv_dereg_mr / ibv_free_dm (O(log n): creating max_pd PDs or max_mr MRs stays linear).
/// Under CommandFile::mu.
template <class T>
struct Listing {
  std::map<uint32_t, std::weak_ptr<T>> live;
  std::map<uint32_t, std::shared_ptr<T>> kept;
  void add(uint32_t handle, const std::shared_ptr<T>& obj) { live[handle] = obj; }
  void remove(uint32_t handle) {
    live.erase(handle);
    kept.erase(handle);
  }
  std::shared_ptr<T> find(uint32_t handle) const {
    auto it = live.find(handle);
    return it == live.end() ? nullptr : it->second.lock();
  }
  /// A handle on `obj` is being unimported: the file keeps the object if that handle was its
  /// last one and it is still listed.
  void keep_if_last(uint32_t handle, const std::shared_ptr<T>& obj) {
    if (obj.use_count() == 1 && live.count(handle)) kept[handle] = obj;
  }
};

/// What a cmd_fd stands for: the device the contexts on it use, and their PDs, MRs and DMs
/// by handle.
struct CommandFile {
  ibv_device* device = nullptr;
  std::weak_ptr<engine::Device> dev;
  dev_t st_dev = 0;
  ino_t st_ino = 0;
  std::mutex mu;
  uint32_t next_pd_handle = 1;
  Listing<engine::ProtectionDomain> pds;
  Listing<engine::MemoryRegion> mrs;
  Listing<engine::DeviceMemory> dms;
  ~CommandFile();
};

}  // namespace softrdma::verbs

namespace {

std::mutex g_files_mu;
/// The command files of this process by the inode of their memfd.
/// Never destroyed (objects.h, "Process-wide state").
std::map<std::pair<dev_t, ino_t>, std::weak_ptr<CommandFile>>& g_files =
    *new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<CommandFile>>;

CommandFile* file_of(ibv_context* ctx) {
  return to_ctx(ctx)->file.get();
}

}  // namespace

namespace softrdma::verbs {

CommandFile::~CommandFile() {
  std::lock_guard lk(g_files_mu);
  auto it = g_files.find({st_dev, st_ino});
  if (it != g_files.end() && it->second.expired()) g_files.erase(it);
}

int open_command_file(ibv_device* device, const std::shared_ptr<engine::Device>& dev,
                      std::shared_ptr<CommandFile>& file) {
  const int fd = ::memfd_create("softrdma-cmd", MFD_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  file = std::make_shared<CommandFile>();
  file->device = device;
  file->dev = dev;
  file->st_dev = st.st_dev;
  file->st_ino = st.st_ino;
  std::lock_guard lk(g_files_mu);
  g_files[{st.st_dev, st.st_ino}] = file;
  return fd;
}

namespace {

// Each handle kind's listing in a command file, and the engine object its handle holds.
Listing<engine::ProtectionDomain>& listing(CommandFile& f, const Pd*) {
  return f.pds;
}
Listing<engine::MemoryRegion>& listing(CommandFile& f, const Mr*) {
  return f.mrs;
}
Listing<engine::DeviceMemory>& listing(CommandFile& f, const Dm*) {
  return f.dms;
}
const std::shared_ptr<engine::ProtectionDomain>& object(const Pd* p) {
  return p->pd;
}
const std::shared_ptr<engine::MemoryRegion>& object(const Mr* m) {
  return m->mr;
}
const std::shared_ptr<engine::DeviceMemory>& object(const Dm* d) {
  return d->dm;
}

/// fn(file, listing of W's kind) under the lock of ctx's command file.
template <class W, class F>
auto with_listing(ibv_context* ctx, F&& fn) {
  CommandFile* f = file_of(ctx);
  std::lock_guard lk(f->mu);
  return fn(*f, listing(*f, static_cast<const W*>(nullptr)));
}

}  // namespace

template <class W>
void publish(ibv_context* ctx, W* w) {
  with_listing<W>(ctx, [&](CommandFile& f, auto& l) {
    if constexpr (std::is_same_v<W, Pd>) w->ibv.handle = f.next_pd_handle++;
    l.add(w->ibv.handle, object(w));
  });
}

template <class W>
void unpublish(W* w) {
  with_listing<W>(w->ibv.context, [&](CommandFile&, auto& l) { l.remove(w->ibv.handle); });
}

template <class W>
void keep_if_last(W* w) {
  with_listing<W>(w->ibv.context,
                  [&](CommandFile&, auto& l) { l.keep_if_last(w->ibv.handle, object(w)); });
}

template <class W>
auto find_published(ibv_context* ctx, uint32_t handle) {
  return with_listing<W>(ctx, [&](CommandFile&, auto& l) { return l.find(handle); });
}

template void publish(ibv_context*, Pd*);
template void publish(ibv_context*, Mr*);
template void publish(ibv_context*, Dm*);
template void unpublish(Pd*);
template void unpublish(Mr*);
template void unpublish(Dm*);
template void keep_if_last(Dm*);

std::shared_ptr<engine::DeviceMemory> find_dm(ibv_context* ctx, uint32_t handle) {
  return find_published<Dm>(ctx, handle);
}

}  // namespace softrdma::verbs

extern "C" {

/// ibv_import_device(3): a new context on the command file `cmd_fd` (a dup of a context's
/// cmd_fd) is of; ibv_close_device closes `cmd_fd`. NULL with errno EINVAL when `cmd_fd` is
/// no open descriptor (rdma-core's fstat check), ENODEV when it is no context's file of this
/// process (a descriptor of another file, or another process's cmd_fd), or ENOMEM.
ibv_context* ibv_import_device(int cmd_fd) {
  struct stat st {};
  if (::fstat(cmd_fd, &st) != 0) return fail<ibv_context>(EINVAL);
  std::shared_ptr<CommandFile> file;
  {
    std::lock_guard lk(g_files_mu);
    if (auto it = g_files.find({st.st_dev, st.st_ino}); it != g_files.end())
      file = it->second.lock();
  }
  if (!file) return fail<ibv_context>(ENODEV);
  std::shared_ptr<engine::Device> dev = file->dev.lock();
  if (!dev) return fail<ibv_context>(ENODEV);
  ibv_device* device = file->device;
  return new_context(std::move(dev), device, std::move(file), cmd_fd);
}

/// ibv_import_pd(3): a new handle on the PD `pd_handle` names in ctx's command file. NULL
/// with errno EINVAL (no context), ENOENT when the file lists no such PD (as the kernel's
/// handle lookup), ENOMEM.
ibv_pd* ibv_import_pd(ibv_context* ctx, uint32_t pd_handle) {
  if (!ctx) return fail<ibv_pd>(EINVAL);
  std::shared_ptr<engine::ProtectionDomain> epd = find_published<Pd>(ctx, pd_handle);
  if (!epd) return fail<ibv_pd>(ENOENT);
  auto* p = new Pd{};
  p->pd = std::move(epd);
  p->ibv.context = ctx;
  p->ibv.handle = pd_handle;
  return &p->ibv;
}

/// ibv_unimport_pd(3): frees the handle; the PD stays (ibv_dealloc_pd through another
/// handle destroys it). A parent domain is not an imported object: nothing is done.
void ibv_unimport_pd(ibv_pd* pd) {
  if (!pd || to_pd(pd)->parent) return;
  Pd* p = to_pd(pd);
  keep_if_last(p);
  delete p;
}

/// ibv_import_mr(3): a new handle on the MR `mr_handle` (its ibv_mr::handle, the key) names
/// in the command file of pd's context; addr, length, lkey and rkey are the MR's. NULL with
/// errno EINVAL (no PD, or an MR of another PD), ENOENT when the file lists no such MR.
ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (!pd) return fail<ibv_mr>(EINVAL);
  std::shared_ptr<engine::MemoryRegion> emr = find_published<Mr>(pd->context, mr_handle);
  if (!emr) return fail<ibv_mr>(ENOENT);
  if (&emr->pd() != to_pd(pd)->pd.get()) return fail<ibv_mr>(EINVAL);
  auto* m = new Mr{};
  m->mr = std::move(emr);
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.addr = m->mr->host();
  m->ibv.length = m->mr->length();
  m->ibv.handle = mr_handle;
  m->ibv.lkey = m->mr->key();
  m->ibv.rkey = m->mr->key();
  return &m->ibv;
}

/// ibv_unimport_mr(3): frees the handle; the MR stays registered (ibv_dereg_mr through
/// another handle deregisters it).
void ibv_unimport_mr(ibv_mr* mr) {
  if (!mr) return;
  Mr* m = to_mr(mr);
  keep_if_last(m);
  delete m;
}

}  // extern "C"
