// NUMA placement over hwloc 2: topology loading (system, synthetic, XML), node lookups by CPU set and by PCI
// bus id, the placement rule for a rank, and thread memory binding. hwloc handles stay inside this file.
#include "zero3/offload/numa.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <hwloc.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <string>
#include <system_error>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::offload {

struct HostTopology::Impl {
  hwloc_topology_t topology = nullptr;
  ~Impl() {
    if (topology != nullptr) hwloc_topology_destroy(topology);
  }
};

namespace {

// Owns an hwloc bitmap; hwloc's C API has no RAII of its own.
class Bitmap {
 public:
  Bitmap() : bitmap_(hwloc_bitmap_alloc()) {
    if (bitmap_ == nullptr) throw OutOfMemory("hwloc_bitmap_alloc failed");
  }
  ~Bitmap() { hwloc_bitmap_free(bitmap_); }
  Bitmap(const Bitmap&) = delete;
  Bitmap& operator=(const Bitmap&) = delete;
  hwloc_bitmap_t get() const { return bitmap_; }

 private:
  hwloc_bitmap_t bitmap_;
};

std::string errno_text(int err) {
  return err == 0 ? std::string("unknown error") : std::error_code(err, std::generic_category()).message();
}

// The first characters of a description, for error messages about text too long to quote whole.
std::string excerpt(std::string_view text) {
  constexpr std::size_t kMax = 120;
  if (text.size() <= kMax) return std::string(text);
  return std::string(text.substr(0, kMax)) + "...";
}

std::unique_ptr<HostTopology::Impl> new_impl(std::string_view what) {
  auto impl = std::make_unique<HostTopology::Impl>();
  if (hwloc_topology_init(&impl->topology) != 0) {
    impl->topology = nullptr;
    throw Error(fmt::format("hwloc_topology_init failed for {}: {}", what, errno_text(errno)));
  }
  return impl;
}

void load(HostTopology::Impl& impl, std::string_view what) {
  if (hwloc_topology_load(impl.topology) != 0) {
    const int err = errno;
    throw Error(fmt::format("hwloc_topology_load failed for {}: {}", what, errno_text(err)));
  }
}

hwloc_obj_t numa_obj(hwloc_topology_t topology, int node) {
  const int count = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  if (node < 0 || node >= count) {
    throw UsageError(fmt::format("NUMA node {} out of range: the topology has {} node(s)", node, count));
  }
  return hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(node));
}

// The logical index of the only NUMA node in `nodeset`; nullopt when it names none or several.
std::optional<int> single_node(hwloc_topology_t topology, hwloc_const_nodeset_t nodeset) {
  if (nodeset == nullptr || hwloc_bitmap_weight(nodeset) != 1) return std::nullopt;
  const int os_index = hwloc_bitmap_first(nodeset);
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topology, static_cast<unsigned>(os_index));
  if (node == nullptr) return std::nullopt;
  return static_cast<int>(node->logical_index);
}

std::vector<int> bitmap_indices(hwloc_const_bitmap_t bitmap) {
  std::vector<int> out;
  if (bitmap == nullptr) return out;
  unsigned index = 0;
  hwloc_bitmap_foreach_begin(index, bitmap) {
    out.push_back(static_cast<int>(index));
  }
  hwloc_bitmap_foreach_end();
  return out;
}

std::string bitmap_list(hwloc_const_bitmap_t bitmap) {
  if (bitmap == nullptr || hwloc_bitmap_iszero(bitmap)) return "none";
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, bitmap) < 0 || text == nullptr) return "?";
  std::string out(text);
  std::free(text);
  return out;
}

std::vector<int> range_of(int count) {
  std::vector<int> out(static_cast<std::size_t>(count));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

void fill_cpuset(hwloc_bitmap_t set, const std::vector<int>& cpus) {
  hwloc_bitmap_zero(set);
  for (int cpu : cpus) {
    if (cpu >= 0) hwloc_bitmap_set(set, static_cast<unsigned>(cpu));
  }
}

// "dddd:bb:dd.f" or "bb:dd.f" (hex; the domain may be written with 8 digits, as nvidia-smi does).
struct PciAddress {
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
};
std::optional<PciAddress> parse_bus_id(std::string_view bus_id) {
  const std::string text(bus_id);
  PciAddress a;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%x:%x:%x.%x%n", &a.domain, &a.bus, &a.dev, &a.func, &consumed) == 4 &&
      static_cast<std::size_t>(consumed) == text.size()) {
    return a;
  }
  a = PciAddress{};
  consumed = 0;
  if (std::sscanf(text.c_str(), "%x:%x.%x%n", &a.bus, &a.dev, &a.func, &consumed) == 3 &&
      static_cast<std::size_t>(consumed) == text.size()) {
    return a;
  }
  return std::nullopt;
}

// Binding failures are a performance matter: reported once per process, not per allocation site.
void warn_binding_once(std::string_view what, int err) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    log::warn("NUMA memory binding unavailable ({}: {}); host memory is placed by the OS's default policy", what,
              errno_text(err));
  }
}

// hwloc dlcloses its PCI plugin with the last topology, and libpciaccess with it; the state libpciaccess
// still holds then reads as a leak to LeakSanitizer on every from_system(). Keeping the library resident
// keeps that state reachable. Absent library: nothing to do.
void keep_pciaccess_resident() {
  static std::once_flag once;
  std::call_once(once, [] { (void)dlopen("libpciaccess.so.0", RTLD_NOW | RTLD_NODELETE); });
}

}  // namespace

HostTopology::HostTopology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostTopology::~HostTopology() = default;
HostTopology::HostTopology(HostTopology&&) noexcept = default;
HostTopology& HostTopology::operator=(HostTopology&&) noexcept = default;

HostTopology HostTopology::from_system() {
  keep_pciaccess_resident();
  auto impl = new_impl("this machine");
  // PCI devices (and the bridges above them) are needed to find a GPU's node; KEEP_IMPORTANT drops the rest.
  hwloc_topology_set_io_types_filter(impl->topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  load(*impl, "this machine");
  return HostTopology(std::move(impl));
}

HostTopology HostTopology::from_synthetic(std::string_view description) {
  auto impl = new_impl("a synthetic topology");
  const std::string text(description);
  if (hwloc_topology_set_synthetic(impl->topology, text.c_str()) != 0) {
    const int err = errno;
    throw Error(fmt::format("invalid hwloc synthetic topology \"{}\": {} (expected e.g. \"pack:2 numa:1 core:4 pu:1\")",
                            excerpt(description), errno_text(err)));
  }
  load(*impl, fmt::format("synthetic topology \"{}\"", excerpt(description)));
  return HostTopology(std::move(impl));
}

HostTopology HostTopology::from_xml(std::string_view xml) {
  auto impl = new_impl("an XML topology");
  // Keep every I/O object the export holds: the PCI devices are why XML is used.
  hwloc_topology_set_io_types_filter(impl->topology, HWLOC_TYPE_FILTER_KEEP_ALL);
  const std::string text(xml);  // hwloc wants the terminating NUL counted in the size
  if (hwloc_topology_set_xmlbuffer(impl->topology, text.c_str(), static_cast<int>(text.size() + 1)) != 0) {
    const int err = errno;
    throw Error(fmt::format("invalid hwloc XML topology ({}): \"{}\"", errno_text(err), excerpt(xml)));
  }
  if (hwloc_topology_load(impl->topology) != 0) {
    const int err = errno;
    throw Error(fmt::format("hwloc could not load the XML topology ({}): \"{}\"", errno_text(err), excerpt(xml)));
  }
  return HostTopology(std::move(impl));
}

int HostTopology::numa_node_count() const {
  return hwloc_get_nbobjs_by_type(impl_->topology, HWLOC_OBJ_NUMANODE);
}

std::vector<int> HostTopology::node_cpus(int node) const {
  return bitmap_indices(numa_obj(impl_->topology, node)->cpuset);
}

std::optional<int> HostTopology::node_of_pci_device(std::string_view bus_id) const {
  const auto address = parse_bus_id(bus_id);
  if (!address) return std::nullopt;
  hwloc_obj_t device =
      hwloc_get_pcidev_by_busid(impl_->topology, address->domain, address->bus, address->dev, address->func);
  if (device == nullptr) return std::nullopt;
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(impl_->topology, device);
  if (ancestor == nullptr) return std::nullopt;
  return single_node(impl_->topology, ancestor->nodeset);
}

std::optional<int> HostTopology::node_of_cpus(const std::vector<int>& cpus) const {
  if (cpus.empty()) return std::nullopt;
  Bitmap wanted;
  Bitmap overlap;
  fill_cpuset(wanted.get(), cpus);
  std::optional<int> best;
  int best_weight = 0;
  const int count = numa_node_count();
  for (int node = 0; node < count; ++node) {
    hwloc_bitmap_and(overlap.get(), wanted.get(), numa_obj(impl_->topology, node)->cpuset);
    const int weight = hwloc_bitmap_weight(overlap.get());
    if (weight > best_weight) {  // ties keep the lower index
      best = node;
      best_weight = weight;
    }
  }
  return best;
}

std::string HostTopology::describe() const {
  const int count = numa_node_count();
  std::string out = fmt::format("{} NUMA node{}:", count, count == 1 ? "" : "s");
  for (int node = 0; node < count; ++node) {
    out += fmt::format("{} node {} cpus {}", node == 0 ? "" : ",", node,
                       bitmap_list(numa_obj(impl_->topology, node)->cpuset));
  }
  return out;
}

NumaPlacement choose_placement(const HostTopology& topology, std::optional<std::string_view> gpu_bus_id,
                               const std::vector<int>& rank_cpus, int local_rank) {
  const int count = topology.numa_node_count();
  ZERO3_CHECK(count >= 1, "the topology has no NUMA node");
  NumaPlacement placement;
  std::optional<int> node;
  bool by_gpu = false;
  if (gpu_bus_id) {
    node = topology.node_of_pci_device(*gpu_bus_id);
    if (node) placement.reason = fmt::format("closest to GPU {}", *gpu_bus_id);
    by_gpu = node.has_value();
  }
  if (!node && !rank_cpus.empty()) {
    // A CPU set spanning every node's CPUs is an unbound process: it says nothing about where the rank
    // belongs, and taking its majority node would put every rank on node 0.
    Bitmap wanted;
    fill_cpuset(wanted.get(), rank_cpus);
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(topology.impl().topology);
    if (!hwloc_bitmap_isincluded(all, wanted.get())) {
      node = topology.node_of_cpus(rank_cpus);
      if (node) placement.reason = "node of the rank's CPU set";
    }
  }
  if (!node) {
    // Spread over the nodes with CPUs: a cgroup can leave a node with none this process may use.
    std::vector<int> candidates;
    for (int n = 0; n < count; ++n) {
      if (!hwloc_bitmap_iszero(numa_obj(topology.impl().topology, n)->cpuset)) candidates.push_back(n);
    }
    if (candidates.empty()) candidates = range_of(count);
    node = candidates[static_cast<std::size_t>(local_rank < 0 ? 0 : local_rank) % candidates.size()];
    placement.reason = fmt::format("local rank {} round-robin over {} node(s)", local_rank, candidates.size());
  }
  if (gpu_bus_id && !by_gpu) {
    placement.reason += fmt::format(" (GPU {} not found below a single node)", *gpu_bus_id);
  }
  placement.node = *node;
  const std::vector<int> node_cpus = topology.node_cpus(*node);
  for (int cpu : node_cpus) {
    if (std::find(rank_cpus.begin(), rank_cpus.end(), cpu) != rank_cpus.end()) placement.cpus.push_back(cpu);
  }
  if (placement.cpus.empty()) placement.cpus = node_cpus;
  if (placement.cpus.empty()) placement.cpus = rank_cpus;
  return placement;
}

struct ScopedMemoryBinding::Saved {
  hwloc_topology_t topology = nullptr;
  Bitmap nodeset;
  hwloc_membind_policy_t policy = HWLOC_MEMBIND_DEFAULT;
};

ScopedMemoryBinding::ScopedMemoryBinding(const HostTopology& topology, int node) {
  hwloc_topology_t topo = topology.impl().topology;
  hwloc_obj_t target = numa_obj(topo, node);
  // A synthetic or XML topology describes another machine: hwloc's binding hooks there are no-ops that
  // report success, so binding is not attempted at all.
  if (!hwloc_topology_is_thissystem(topo)) return;
  auto saved = std::make_unique<Saved>();
  saved->topology = topo;
  constexpr int kFlags = HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET;
  if (hwloc_get_membind(topo, saved->nodeset.get(), &saved->policy, kFlags) != 0) {
    warn_binding_once("hwloc_get_membind", errno);
    return;
  }
  if (hwloc_set_membind(topo, target->nodeset, HWLOC_MEMBIND_BIND, kFlags) != 0) {
    warn_binding_once(fmt::format("hwloc_set_membind to node {}", node), errno);
    return;
  }
  saved_ = std::move(saved);
  bound_ = true;
}

ScopedMemoryBinding::~ScopedMemoryBinding() {
  if (!bound_) return;
  constexpr int kFlags = HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET;
  // A thread policy is never MIXED, but restoring one would fail: fall back to the default then.
  const hwloc_membind_policy_t policy = saved_->policy < 0 ? HWLOC_MEMBIND_DEFAULT : saved_->policy;
  if (hwloc_set_membind(saved_->topology, saved_->nodeset.get(), policy, kFlags) != 0) {
    warn_binding_once("restoring the thread's memory policy", errno);
  }
}

std::optional<int> node_of_memory(const HostTopology& topology, const void* ptr) {
  hwloc_topology_t topo = topology.impl().topology;
  if (ptr == nullptr || !hwloc_topology_is_thissystem(topo)) return std::nullopt;
  Bitmap nodeset;
  if (hwloc_get_area_memlocation(topo, ptr, 1, nodeset.get(), HWLOC_MEMBIND_BYNODESET) != 0) return std::nullopt;
  return single_node(topo, nodeset.get());
}

}  // namespace zero3::offload
