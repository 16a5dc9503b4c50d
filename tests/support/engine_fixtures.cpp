#include "engine_fixtures.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <span>
#include <stdexcept>
#include <utility>

#include "device_staging.hpp"
#include "mpi_test_env.hpp"
#include "zero3/config/parse.hpp"

namespace zero3::test {

std::string ConfigText::json() const {
  const int world = mpi_env().world.size;
  std::string s = train_batch > 0 ? fmt::format(R"("train_batch_size": {}, "train_micro_batch_size_per_gpu": {})",
                                                train_batch, train_batch / (world * gas))
                                  : std::string(R"("train_micro_batch_size_per_gpu": 1)");
  s += fmt::format(R"(, "gradient_accumulation_steps": {}, "gradient_clipping": {})", gas, clipping);
  if (!optimizer.empty()) s += fmt::format(R"(, "optimizer": {})", optimizer);
  if (!scheduler.empty()) s += fmt::format(R"(, "scheduler": {})", scheduler);
  if (!precision.empty()) s += ", " + precision;
  if (!top.empty()) s += ", " + top;
  s += fmt::format(R"(, "zero_optimization": {{"stage": {}{}{}}})", stage, zero.empty() ? "" : ", ", zero);
  s += fmt::format(R"(, "zero3": {{"seed": {}, "device": "{}"{}{}}})", seed, test_device_name(),
                   zero3_extra.empty() ? "" : ", ", zero3_extra);
  return "{" + s + "}";
}

config::Config ConfigText::parse() const {
  const std::string text = json();
  config::ParseOptions options;
  options.world_size = mpi_env().world.size;
  options.world_size_source = "mpirun";
  const config::ParseResult r = config::parse_config_text(text, options);
  std::string refused;
  for (const auto& d : r.errors) refused += config::format_diagnostic("error", d) + "\n";
  if (!allow_not_implemented) {
    for (const auto& d : r.not_implemented) refused += config::format_diagnostic("not implemented", d) + "\n";
  }
  if (!r.ok() || !refused.empty()) throw std::runtime_error("the test's config is refused:\n" + refused + text);
  return *r.config;
}

std::unique_ptr<Engine> make_engine(const config::Config& config, const EngineOptions& options) {
  MpiTestEnv& env = mpi_env();
  EngineResources resources;
  if (options.device_from_test) {
    resources.device = test_device_kind() == DeviceKind::cuda
                           ? std::shared_ptr<Device>(make_cuda_device(env.world.local_rank % cuda_device_count()))
                           : std::shared_ptr<Device>(make_host_device());
  }
  resources.bootstrap = env.bootstrap;
  auto engine = std::make_unique<Engine>(config, env.world, std::move(resources));
  if (options.units.empty()) return engine;
  for (const UnitSpec& u : options.units) engine->add_unit(u);
  engine->finalize();
  return engine;
}

std::vector<std::byte> state_bytes(Engine& e) {
  const EngineState st = e.state();
  const std::vector<ParamSlice> slices = st.local_slices(false);
  std::vector<std::byte> all;
  for (const TensorKind k : {TensorKind::param, TensorKind::master, TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
    std::vector<std::byte> part(st.state_bytes(k, slices));
    st.read_state(k, slices, part);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

std::vector<float> local_floats(Engine& e, TensorKind kind) {
  const EngineState st = e.state();
  const std::vector<ParamSlice> slices = st.local_slices(false);
  std::vector<float> v(st.state_bytes(kind, slices) / sizeof(float));
  st.read_state(kind, slices, std::as_writable_bytes(std::span<float>(v)));
  return v;
}

std::string nvme_test_directory() {
  const std::filesystem::path p = std::filesystem::current_path() / "zero3-test-nvme";
  std::filesystem::create_directories(p);
  return p.string();
}

bool nvme_rank_directory_removed(const std::string& dir, int rank) {
  const std::string pid = fmt::format("-{}-", ::getpid());
  const std::string suffix = fmt::format("-rank{}", rank);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(pid) != std::string::npos && name.ends_with(suffix)) return false;
  }
  return true;
}

}  // namespace zero3::test
