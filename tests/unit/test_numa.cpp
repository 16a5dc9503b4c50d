// NUMA placement: synthetic topologies with several nodes (node CPUs, node of a CPU set, the placement rule,
// describe), a hand-written XML topology with GPUs below two different nodes (and one below the machine), and
// this machine (memory binding moves first-touched pages to the node, and the thread's policy comes back).
// What this machine cannot show (the OS refusing the binding or the queries) is not a pass: the program
// then exits 77 (tests/support/skip.hpp), which ctest reports as Skipped; offload_numa.tests.cmake runs that test case
// ([membind]) on its own, as unit.offload_numa.membind.
#define CATCH_CONFIG_RUNNER
#include <hwloc.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "skip.hpp"
#include "zero3/core/cpus.hpp"
#include "zero3/core/error.hpp"
#include "zero3/offload/numa.hpp"

using namespace zero3;
using namespace zero3::offload;

namespace {

// What a test case could not check on this machine; main exits 77 when there is any and nothing failed.
std::vector<std::string> g_skipped;
void skip(const std::string& what) {
  WARN("skipped: " << what);
  g_skipped.push_back(what);
}

std::vector<int> range(int first, int count) {
  std::vector<int> out(static_cast<std::size_t>(count));
  std::iota(out.begin(), out.end(), first);
  return out;
}

// Two packages with one NUMA node each (CPUs 0-1 and 2-3). GPU 0000:3b:00.0 sits below a host bridge of
// package 0, GPU 0000:d8:00.0 below a PCI bridge below a host bridge of package 1, and GPU 0000:01:00.0
// below the machine itself (both nodes: no single closest node). Written as hwloc 2's XML export does.
constexpr const char* kTwoGpuXml = R"(<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" allowed_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
      </object>
      <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[3a-3b]">
        <object type="PCIDev" gp_index="21" pci_busid="0000:3b:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9" local_memory="1073741824"/>
      <object type="Core" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11"/>
      </object>
      <object type="Core" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="12">
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="13"/>
      </object>
      <object type="Bridge" gp_index="22" bridge_type="0-1" depth="0" bridge_pci="0000:[d7-d9]">
        <object type="Bridge" gp_index="23" bridge_type="1-1" depth="1" bridge_pci="0000:[d8-d9]" pci_busid="0000:d7:01.0" pci_type="0604 [8086:2030] [0000:0000] 04" pci_link_speed="0.000000">
          <object type="PCIDev" gp_index="24" pci_busid="0000:d8:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000"/>
        </object>
      </object>
    </object>
    <object type="Bridge" gp_index="25" bridge_type="0-1" depth="0" bridge_pci="0000:[00-01]">
      <object type="PCIDev" gp_index="26" pci_busid="0000:01:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000"/>
    </object>
  </object>
</topology>
)";

}  // namespace

TEST_CASE("synthetic: two packages with one node each") {
  const HostTopology topology = HostTopology::from_synthetic("pack:2 numa:1 core:4 pu:2");
  REQUIRE(topology.numa_node_count() == 2);
  CHECK(topology.node_cpus(0) == range(0, 8));
  CHECK(topology.node_cpus(1) == range(8, 8));
  CHECK_THROWS_AS(topology.node_cpus(2), UsageError);
  CHECK_THROWS_AS(topology.node_cpus(-1), UsageError);

  CHECK(topology.node_of_cpus({8, 9}) == 1);
  CHECK(topology.node_of_cpus({0, 8, 9}) == 1);  // most overlap
  CHECK(topology.node_of_cpus({7, 8}) == 0);     // a tie keeps the lower index
  CHECK(topology.node_of_cpus(range(0, 16)) == 0);
  CHECK_FALSE(topology.node_of_cpus({}).has_value());
  CHECK_FALSE(topology.node_of_cpus({100, 101}).has_value());

  CHECK(topology.describe() == "2 NUMA nodes: node 0 cpus 0-7, node 1 cpus 8-15");
  // No PCI devices in a synthetic topology.
  CHECK_FALSE(topology.node_of_pci_device("0000:3b:00.0").has_value());
}

TEST_CASE("synthetic: placement by the rank's CPU set") {
  const HostTopology topology = HostTopology::from_synthetic("pack:2 numa:1 core:4 pu:2");
  SECTION("bound to node 1: node 1, the bound CPUs only") {
    const NumaPlacement p = choose_placement(topology, std::nullopt, {10, 11, 12}, 0);
    CHECK(p.node == 1);
    CHECK(p.cpus == std::vector<int>{10, 11, 12});
    CHECK(p.reason == "node of the rank's CPU set");
  }
  SECTION("bound across both nodes: the node holding most of them, local rank ignored") {
    const NumaPlacement p = choose_placement(topology, std::nullopt, {6, 7, 8, 9, 10}, 0);
    CHECK(p.node == 1);
    CHECK(p.cpus == std::vector<int>{8, 9, 10});
  }
  SECTION("a GPU the topology lacks falls back to the CPU set") {
    const NumaPlacement p = choose_placement(topology, std::string_view("0000:3b:00.0"), {0, 1}, 1);
    CHECK(p.node == 0);
    CHECK(p.cpus == std::vector<int>{0, 1});
  }
}

TEST_CASE("synthetic: four nodes, round-robin by local rank when the CPU set says nothing") {
  const HostTopology topology = HostTopology::from_synthetic("numa:4 core:2 pu:1");
  REQUIRE(topology.numa_node_count() == 4);
  CHECK(topology.describe() == "4 NUMA nodes: node 0 cpus 0-1, node 1 cpus 2-3, node 2 cpus 4-5, node 3 cpus 6-7");
  const std::vector<int> unbound = range(0, 8);  // every CPU: an unbound process
  for (int local_rank = 0; local_rank < 6; ++local_rank) {
    for (const std::vector<int>& cpus : {unbound, std::vector<int>{}}) {
      const NumaPlacement p = choose_placement(topology, std::nullopt, cpus, local_rank);
      CHECK(p.node == local_rank % 4);
      CHECK(p.cpus == topology.node_cpus(local_rank % 4));
      CHECK(p.reason.find("round-robin") != std::string::npos);
    }
  }
  // A binding still wins over the local rank.
  CHECK(choose_placement(topology, std::nullopt, {5}, 0).node == 2);
  CHECK(choose_placement(topology, std::nullopt, {5}, 0).cpus == std::vector<int>{5});
  CHECK(choose_placement(topology, std::nullopt, {}, -3).node == 0);
}

TEST_CASE("synthetic: one node") {
  const HostTopology topology = HostTopology::from_synthetic("core:4 pu:1");
  REQUIRE(topology.numa_node_count() == 1);
  CHECK(topology.node_cpus(0) == range(0, 4));
  CHECK(topology.describe() == "1 NUMA node: node 0 cpus 0-3");
  for (int local_rank = 0; local_rank < 3; ++local_rank) {
    CHECK(choose_placement(topology, std::nullopt, range(0, 4), local_rank).node == 0);
    CHECK(choose_placement(topology, std::nullopt, {2}, local_rank).cpus == std::vector<int>{2});
  }
}

TEST_CASE("synthetic and XML topologies are not this machine: no binding, no page lookup") {
  const HostTopology topology = HostTopology::from_synthetic("pack:2 numa:1 core:1 pu:1");
  const ScopedMemoryBinding binding(topology, 1);
  CHECK_FALSE(binding.bound());
  int value = 7;
  CHECK_FALSE(node_of_memory(topology, &value).has_value());
  CHECK_THROWS_AS(ScopedMemoryBinding(topology, 2), UsageError);

  const HostTopology xml = HostTopology::from_xml(kTwoGpuXml);
  CHECK_FALSE(ScopedMemoryBinding(xml, 0).bound());
}

TEST_CASE("bad synthetic or XML text is an Error quoting it") {
  try {
    (void)HostTopology::from_synthetic("pack:2 banana:3");
    FAIL("expected zero3::Error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("pack:2 banana:3") != std::string::npos);
  }
  try {
    (void)HostTopology::from_xml("<topology version=\"2.0\"><object type=");
    FAIL("expected zero3::Error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("<topology version") != std::string::npos);
  }
  CHECK_THROWS_AS(HostTopology::from_xml(""), Error);
}

TEST_CASE("XML: GPUs below two different nodes") {
  const HostTopology topology = HostTopology::from_xml(kTwoGpuXml);
  REQUIRE(topology.numa_node_count() == 2);
  CHECK(topology.describe() == "2 NUMA nodes: node 0 cpus 0-1, node 1 cpus 2-3");

  CHECK(topology.node_of_pci_device("0000:3b:00.0") == 0);
  CHECK(topology.node_of_pci_device("0000:d8:00.0") == 1);               // through a PCI bridge
  CHECK(topology.node_of_pci_device("0000:D8:00.0") == 1);               // cudaDeviceGetPCIBusId writes upper case
  CHECK(topology.node_of_pci_device("00000000:D8:00.0") == 1);           // nvidia-smi's 8-digit domain
  CHECK(topology.node_of_pci_device("d8:00.0") == 1);                    // no domain: 0000
  CHECK_FALSE(topology.node_of_pci_device("0000:01:00.0").has_value());  // below the machine: both nodes
  CHECK_FALSE(topology.node_of_pci_device("0000:5e:00.0").has_value());  // unknown
  CHECK_FALSE(topology.node_of_pci_device("0001:3b:00.0").has_value());  // other domain
  CHECK_FALSE(topology.node_of_pci_device("not a bus id").has_value());
  CHECK_FALSE(topology.node_of_pci_device("0000:3b:00.0 ").has_value());
  CHECK_FALSE(topology.node_of_pci_device("").has_value());

  SECTION("the GPU's node wins over the CPU set's") {
    const NumaPlacement p = choose_placement(topology, std::string_view("0000:d8:00.0"), {0, 1}, 0);
    CHECK(p.node == 1);
    CHECK(p.cpus == std::vector<int>{2, 3});  // no overlap with the CPU set: all of the node's
    CHECK(p.reason == "closest to GPU 0000:d8:00.0");
    const NumaPlacement q = choose_placement(topology, std::string_view("0000:3b:00.0"), {1, 2, 3}, 1);
    CHECK(q.node == 0);
    CHECK(q.cpus == std::vector<int>{1});  // the node's CPUs within the CPU set
  }
  SECTION("a GPU below both nodes falls back to the CPU set, then to the local rank") {
    CHECK(choose_placement(topology, std::string_view("0000:01:00.0"), {3}, 0).node == 1);
    const NumaPlacement p = choose_placement(topology, std::string_view("0000:01:00.0"), range(0, 4), 1);
    CHECK(p.node == 1);
    CHECK(p.reason.find("round-robin") != std::string::npos);
  }
}

TEST_CASE("XML: a node left without CPUs by the allowed set") {
  // As a cpuset cgroup leaves it: node 1's processors are not allowed, so node 1 has none.
  std::string xml = kTwoGpuXml;
  const std::string from = "allowed_cpuset=\"0x0000000f\"";
  const std::size_t at = xml.find(from);
  REQUIRE(at != std::string::npos);
  xml.replace(at, from.size(), "allowed_cpuset=\"0x00000003\"");
  const HostTopology topology = HostTopology::from_xml(xml);
  REQUIRE(topology.numa_node_count() == 2);
  CHECK(topology.node_cpus(1).empty());
  for (int local_rank = 0; local_rank < 3; ++local_rank) {
    const NumaPlacement p = choose_placement(topology, std::nullopt, {0, 1}, local_rank);
    CHECK(p.node == 0);  // round-robin skips the node without CPUs
    CHECK(p.cpus == std::vector<int>{0, 1});
  }
  // The GPU's node still holds the memory; the threads run where the process may.
  const NumaPlacement p = choose_placement(topology, std::string_view("0000:d8:00.0"), {0, 1}, 0);
  CHECK(p.node == 1);
  CHECK(p.cpus == std::vector<int>{0, 1});
}

TEST_CASE("this machine") {
  const HostTopology topology = HostTopology::from_system();
  REQUIRE(topology.numa_node_count() >= 1);
  INFO(topology.describe());
  const std::vector<int> cpus = zero3::process_cpus();
  REQUIRE_FALSE(cpus.empty());
  CHECK(topology.node_of_cpus(cpus).has_value());
  const NumaPlacement placement = choose_placement(topology, std::nullopt, cpus, 0);
  CHECK(placement.node >= 0);
  CHECK(placement.node < topology.numa_node_count());
  CHECK_FALSE(placement.cpus.empty());
}

TEST_CASE("this machine: memory bound to node 0 and the thread's policy restored", "[membind]") {
  const HostTopology topology = HostTopology::from_system();

  // Our own view of the thread's policy, independent of the code under test.
  hwloc_topology_t probe = nullptr;
  REQUIRE(hwloc_topology_init(&probe) == 0);
  REQUIRE(hwloc_topology_load(probe) == 0);
  hwloc_bitmap_t before = hwloc_bitmap_alloc();
  hwloc_bitmap_t after = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy_before = HWLOC_MEMBIND_DEFAULT;
  hwloc_membind_policy_t policy_after = HWLOC_MEMBIND_DEFAULT;
  constexpr int kFlags = HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET;
  const bool can_query = hwloc_get_membind(probe, before, &policy_before, kFlags) == 0;

  {
    const ScopedMemoryBinding binding(topology, 0);
    if (!binding.bound()) {
      skip("the OS refused memory binding here (e.g. a container without CAP_SYS_NICE)");
    } else {
      constexpr std::size_t kBytes = std::size_t{8} << 20;
      void* raw = std::aligned_alloc(4096, kBytes);
      REQUIRE(raw != nullptr);
      std::memset(raw, 0x5a, kBytes);  // first touch under the binding
      int located = 0;
      for (std::size_t offset = 0; offset < kBytes; offset += std::size_t{1} << 20) {
        const auto node = node_of_memory(topology, static_cast<char*>(raw) + offset);
        if (node) {
          ++located;
          CHECK(*node == 0);
        }
      }
      if (located == 0) skip("the OS tells no page's node here: where the bound memory went is unchecked");
      std::free(raw);
    }
  }
  if (can_query) {
    REQUIRE(hwloc_get_membind(probe, after, &policy_after, kFlags) == 0);
    CHECK(policy_after == policy_before);
    CHECK(hwloc_bitmap_isequal(after, before));
  } else {
    skip("the thread's memory policy cannot be read here: its restoration is unchecked");
  }
  hwloc_bitmap_free(after);
  hwloc_bitmap_free(before);
  hwloc_topology_destroy(probe);
}

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  if (failed != 0 || g_skipped.empty()) return failed;
  std::string reasons;
  for (const std::string& what : g_skipped) reasons += (reasons.empty() ? "" : "; ") + what;
  zero3::test::skip(reasons);
}
