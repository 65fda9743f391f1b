// cm.dlclose: a program that loads softrdma's librdmacm.so.1 with dlopen (as libfabric's verbs
// provider is loaded by Open MPI's ofi MTL, and unloaded by its MPI_Finalize), uses it so that
// its threads start (an event channel, an ID bound to a softrdma address, a second ID resolved
// towards it: a device, its CM thread, its engine's progress), destroys everything, dlclose()s
// the library and then keeps running. Nothing of the library may run after that: a thread, a
// timer or a signal handler left behind in the unmapped code crashes the process here, as it
// crashed Open MPI a few seconds after MPI_Finalize (issue 22 item 3).
//
//   dlclose_test LIBDIR ADDRESS PORT [SECONDS]
//
// LIBDIR holds librdmacm.so.1 and libibverbs.so.1 (build/lib); the program must run with
// LIBDIR first in LD_LIBRARY_PATH, so that the librdmacm.so.1 it loads finds softrdma's
// libibverbs.so.1. Exit status 0 when the process is still alive SECONDS (default 3) after the
// dlclose, 1 when a call failed; a crash is the signal's status.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

namespace {

/// The librdmacm entry points the program calls, found with dlsym.
struct Api {
  rdma_event_channel* (*create_event_channel)();
  void (*destroy_event_channel)(rdma_event_channel*);
  int (*create_id)(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space);
  int (*destroy_id)(rdma_cm_id*);
  int (*bind_addr)(rdma_cm_id*, sockaddr*);
  int (*listen)(rdma_cm_id*, int);
  int (*resolve_addr)(rdma_cm_id*, sockaddr*, sockaddr*, int);
  int (*get_cm_event)(rdma_event_channel*, rdma_cm_event**);
  int (*ack_cm_event)(rdma_cm_event*);
};

template <typename F>
bool find(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  if (!f) std::fprintf(stderr, "dlclose_test: %s not found: %s\n", name, ::dlerror());
  return f != nullptr;
}

sockaddr_in address(const char* ip, int port) {
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, ip, &sin.sin_addr);
  return sin;
}

/// One round of use: a listener at ip:port, a second ID resolved towards it (ADDR_RESOLVED
/// fetched and acknowledged), both destroyed with their channel.
bool use(const Api& a, const char* ip, int port) {
  rdma_event_channel* ch = a.create_event_channel();
  if (!ch) return std::perror("rdma_create_event_channel"), false;
  rdma_cm_id *listener = nullptr, *client = nullptr;
  bool ok = a.create_id(ch, &listener, nullptr, RDMA_PS_TCP) == 0 &&
            a.create_id(ch, &client, nullptr, RDMA_PS_TCP) == 0;
  sockaddr_in here = address(ip, port);
  ok = ok && a.bind_addr(listener, reinterpret_cast<sockaddr*>(&here)) == 0 &&
       a.listen(listener, 1) == 0 &&
       a.resolve_addr(client, nullptr, reinterpret_cast<sockaddr*>(&here), 1000) == 0;
  rdma_cm_event* ev = nullptr;
  if (ok && a.get_cm_event(ch, &ev) == 0) {
    ok = ev->event == RDMA_CM_EVENT_ADDR_RESOLVED;
    a.ack_cm_event(ev);
  } else {
    ok = false;
  }
  if (!ok) std::perror("dlclose_test: using librdmacm");
  if (client) a.destroy_id(client);
  if (listener) a.destroy_id(listener);
  a.destroy_event_channel(ch);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: dlclose_test LIBDIR ADDRESS PORT [SECONDS]\n");
    return 2;
  }
  const std::string lib_path = std::string(argv[1]) + "/librdmacm.so.1";
  const int seconds = argc > 4 ? std::atoi(argv[4]) : 3;
  // Twice: a second load after the first unload must start from a clean library as well.
  for (int round = 0; round < 2; ++round) {
    void* lib = ::dlopen(lib_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return std::fprintf(stderr, "dlclose_test: dlopen: %s\n", ::dlerror()), 1;
    Api a{};
    if (!find(lib, "rdma_create_event_channel", a.create_event_channel) ||
        !find(lib, "rdma_destroy_event_channel", a.destroy_event_channel) ||
        !find(lib, "rdma_create_id", a.create_id) || !find(lib, "rdma_destroy_id", a.destroy_id) ||
        !find(lib, "rdma_bind_addr", a.bind_addr) || !find(lib, "rdma_listen", a.listen) ||
        !find(lib, "rdma_resolve_addr", a.resolve_addr) ||
        !find(lib, "rdma_get_cm_event", a.get_cm_event) ||
        !find(lib, "rdma_ack_cm_event", a.ack_cm_event))
      return 1;
    if (!use(a, argv[2], std::atoi(argv[3]) + round)) return 1;
    if (::dlclose(lib) != 0) return std::fprintf(stderr, "dlclose: %s\n", ::dlerror()), 1;
    // Is the library still mapped? (RTLD_NOLOAD finds it only if something pins it.)
    void* again = ::dlopen(lib_path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    std::printf("round %d: librdmacm.so.1 %s after dlclose\n", round,
                again ? "still loaded" : "unloaded");
    if (again) ::dlclose(again);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
  }
  // A fault after the unload reaches whatever SIGSEGV / SIGBUS handler is installed: it must
  // be in a loaded object, never in the unmapped library (the engine's fault guard).
  for (int sig : {SIGSEGV, SIGBUS}) {
    struct sigaction sa {};
    ::sigaction(sig, nullptr, &sa);
    void* fn = (sa.sa_flags & SA_SIGINFO) ? reinterpret_cast<void*>(sa.sa_sigaction)
                                          : reinterpret_cast<void*>(sa.sa_handler);
    Dl_info info{};
    if (fn != reinterpret_cast<void*>(SIG_DFL) && fn != reinterpret_cast<void*>(SIG_IGN) &&
        ::dladdr(fn, &info) == 0) {
      std::fprintf(stderr, "dlclose_test: the %s handler %p is in no loaded object\n",
                   sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", fn);
      return 1;
    }
  }
  std::printf("alive %d s after each dlclose\n", seconds);
  return 0;
}
