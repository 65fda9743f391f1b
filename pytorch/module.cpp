// softrdma_torch._C: the Python binding of ProcessGroupSoftrdma (pybind11, with torch's
// intrusive_ptr holder so torch.distributed takes it as a c10d ProcessGroup). The package's
// __init__.py registers it as torch.distributed backend "softrdma".
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "pytorch/process_group.h"

namespace py = pybind11;
using softrdma::pytorch::ProcessGroupSoftrdma;

PYBIND11_MODULE(_C, m) {
  m.doc() = "softrdma's torch.distributed backend (ProcessGroupSoftrdma over ccl)";
  // Registers c10d's ProcessGroup and Store types with pybind11 before they are used here.
  py::module_::import("torch.distributed");

  py::class_<ProcessGroupSoftrdma, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupSoftrdma>>(
      m, "ProcessGroupSoftrdma",
      "A c10d ProcessGroup over softrdma's collectives. Created by torch.distributed through "
      "the backend registered as 'softrdma'; ProcessGroupSoftrdma(store, rank, size, timeout) "
      "connects the ranks through `store` (collective).")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupSoftrdma>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("local_address", &ProcessGroupSoftrdma::local_address,
                             "this rank's verbs device address, e.g. '127.0.0.2'")
      .def_property_readonly("device_name", &ProcessGroupSoftrdma::device_name,
                             "the verbs device in use, e.g. 'srdma0'");

  m.def("verbs_library", &softrdma::pytorch::verbs_library_path,
        "path of the libibverbs.so.1 this process loaded ('' if none)");
  m.def("softrdma_library_dir", &softrdma::pytorch::softrdma_library_dir,
        "directory of softrdma's drop-in libibverbs.so.1 (build/lib)");
  m.def("verbs_library_is_softrdma", &softrdma::pytorch::verbs_library_is_softrdma,
        "whether the loaded libibverbs.so.1 is softrdma's drop-in");
}
