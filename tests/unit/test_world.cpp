// World::from_lookup over maps: the launcher families, their agreement, and every inconsistency the
// environment can hold, each an error naming the variables and values.
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "zero3/comm/world.hpp"
#include "zero3/core/error.hpp"

using Catch::Matchers::Contains;
using zero3::ConfigError;
using zero3::comm::World;
using Env = std::map<std::string, std::string>;

namespace {

World from(const Env& env) {
  return World::from_lookup([&](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

Env ompi(const std::string& rank, const std::string& size, const std::string& local_rank,
         const std::string& local_size) {
  return {{"OMPI_COMM_WORLD_RANK", rank},
          {"OMPI_COMM_WORLD_SIZE", size},
          {"OMPI_COMM_WORLD_LOCAL_RANK", local_rank},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", local_size}};
}

Env generic(const std::string& rank, const std::string& size, const std::string& local_rank,
            const std::string& local_size) {
  return {{"RANK", rank}, {"WORLD_SIZE", size}, {"LOCAL_RANK", local_rank}, {"LOCAL_WORLD_SIZE", local_size}};
}

Env merge(Env a, const Env& b) {
  a.insert(b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("no launcher variables: a single process") {
  const World w = from({{"PATH", "/usr/bin"}});
  CHECK(w.rank == 0);
  CHECK(w.size == 1);
  CHECK(w.local_rank == 0);
  CHECK(w.local_size == 1);
  CHECK_THAT(w.source, Contains("single process"));
}

TEST_CASE("Open MPI's variables") {
  const World w = from(ompi("5", "8", "1", "4"));
  CHECK(w.rank == 5);
  CHECK(w.size == 8);
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 4);
  CHECK_THAT(w.source, Contains("mpirun"));
}

TEST_CASE("torchrun-style variables") {
  const World w = from(generic("2", "3", "2", "3"));
  CHECK(w.rank == 2);
  CHECK(w.size == 3);
  CHECK(w.local_rank == 2);
  CHECK(w.local_size == 3);
  CHECK_THAT(w.source, Contains("RANK, WORLD_SIZE"));
}

TEST_CASE("both families present and agreeing: mpirun wins the label") {
  const World w = from(merge(ompi("1", "2", "1", "2"), generic("1", "2", "1", "2")));
  CHECK(w.rank == 1);
  CHECK(w.size == 2);
  CHECK_THAT(w.source, Contains("mpirun"));
}

TEST_CASE("both families present and disagreeing") {
  const Env env = merge(ompi("1", "2", "1", "2"), generic("0", "2", "0", "2"));
  CHECK_THROWS_AS(from(env), ConfigError);
  CHECK_THROWS_WITH(from(env), Contains("OMPI_COMM_WORLD_RANK=1 but RANK=0") &&
                                   Contains("OMPI_COMM_WORLD_LOCAL_RANK=1 but LOCAL_RANK=0") &&
                                   !Contains("WORLD_SIZE=2 but"));
}

TEST_CASE("rank out of range") {
  CHECK_THROWS_WITH(from(generic("4", "4", "0", "1")), Contains("RANK=4") && Contains("WORLD_SIZE=4"));
  CHECK_THROWS_WITH(from(generic("-1", "4", "0", "1")), Contains("RANK=-1"));
  CHECK_THROWS_WITH(from(ompi("7", "2", "0", "1")), Contains("OMPI_COMM_WORLD_RANK=7"));
}

TEST_CASE("sizes below one") {
  CHECK_THROWS_WITH(from(generic("0", "0", "0", "1")), Contains("WORLD_SIZE=0") && Contains("at least 1"));
  CHECK_THROWS_WITH(from(generic("0", "2", "0", "0")), Contains("LOCAL_WORLD_SIZE=0"));
}

TEST_CASE("local rank out of range, local size above size") {
  CHECK_THROWS_WITH(from(generic("1", "4", "2", "2")), Contains("LOCAL_RANK=2") && Contains("LOCAL_WORLD_SIZE=2"));
  CHECK_THROWS_WITH(from(ompi("0", "2", "-3", "2")), Contains("OMPI_COMM_WORLD_LOCAL_RANK=-3"));
  CHECK_THROWS_WITH(from(generic("0", "2", "0", "3")), Contains("LOCAL_WORLD_SIZE=3") && Contains("WORLD_SIZE=2"));
}

TEST_CASE("values that are not decimal integers") {
  for (const std::string bad : {"abc", "", "1.5", " 1", "1 ", "+1", "0x2", "99999999999999999999"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_AS(from(generic(bad, "4", "0", "1")), ConfigError);
    CHECK_THROWS_WITH(from(generic("0", bad, "0", "1")),
                      Contains("WORLD_SIZE='" + bad + "'") && Contains("not a decimal integer"));
  }
}

TEST_CASE("only some variables of a family set") {
  CHECK_THROWS_WITH(from({{"RANK", "0"}}), Contains("RANK='0'") && Contains("WORLD_SIZE unset") &&
                                               Contains("LOCAL_RANK unset") && Contains("LOCAL_WORLD_SIZE unset"));
  CHECK_THROWS_WITH(from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), Contains("incomplete") && Contains("LOCAL_RANK unset"));
  CHECK_THROWS_WITH(from({{"OMPI_COMM_WORLD_SIZE", "2"}}), Contains("OMPI_COMM_WORLD_RANK unset"));
  // Even when the other family is complete, a partial one is a mistake worth reporting.
  CHECK_THROWS_AS(from(merge(ompi("0", "1", "0", "1"), {{"LOCAL_RANK", "0"}})), ConfigError);
}

TEST_CASE("from_environment reads the process environment") {
  // ctest runs unit tests without a launcher, so this is either a single process or a consistent world.
  const World w = World::from_environment();
  CHECK(w.size >= 1);
  CHECK(w.rank < w.size);
  CHECK(w.local_rank < w.local_size);
}
