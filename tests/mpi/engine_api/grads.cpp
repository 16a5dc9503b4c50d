// Gradient accumulation and reduction: after gradient_accumulation_steps micro-steps each rank's gradient is
// the mean over ranks of the sum over micro-steps, for fp32, bf16 and fp16, with small reduce buckets.
#include <catch2/catch.hpp>
#include <vector>

#include "api_fixtures.hpp"
#include "zero3/core/dtype.hpp"

using namespace zero3;
using namespace zero3::test::engine_api;
using Catch::Matchers::Contains;

TEST_CASE("gradients accumulate the mean over ranks of the sum over micro-steps", "[engine][grads]") {
  struct Case {
    const char* name;
    const char* top;
    DType comm;
  };
  const Case cases[] = {
      {"fp32", "", DType::f32},
      {"bf16, fp32 communication", R"("bf16": {"enabled": true}, "communication_data_type": "fp32")", DType::f32},
      {"bf16, bf16 communication", R"("bf16": {"enabled": true})", DType::bf16},
  };
  const std::vector<UnitSpec> units = {flat_unit("big", 1536), flat_unit("odd", 700), flat_unit("norm", 40),
                                       unit("mixed", {param("mixed.w", {10, 13}, ParamInit::normal({.std = 0.1})),
                                                      param("mixed.frozen", {9}, ParamInit::ones(), false),
                                                      param("mixed.b", {13}, ParamInit::zeros())})};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      ConfigText text;
      text.gas = 4;
      text.top = c.top;
      // Small buckets: "big" and "odd" go in several pieces per reduce-scatter.
      text.zero = R"("reduce_bucket_size": 256, "stage3_param_persistence_threshold": 50)";
      auto e = make_engine(text);
      declare(*e, units);
      for (int micro = 0; micro < 4; ++micro) {
        forward_backward(*e, names(units), micro);
        if (micro < 3) CHECK_FALSE(e->step().boundary);
      }
      const float w = static_cast<float>(world_size());
      for (const UnitSpec& u : units) {
        for (const ParamSpec& p : u.params) {
          if (!p.trainable) continue;
          INFO("param " << p.name);
          std::vector<float> expected(p.numel(), 0.0f);
          for (int micro = 0; micro < 4; ++micro) {
            for (std::size_t i = 0; i < expected.size(); ++i) {
              float sum = 0.0f;  // exact: multiples of 1/64 far below 2^24 / 64
              for (int r = 0; r < world_size(); ++r) sum += grad_value(p.name, r, micro, i);
              float mean = sum / w;  // the communicator's avg: one fp32 division, one rounding to the dtype
              if (c.comm == DType::bf16) mean = bf16_to_float(float_to_bf16(mean));
              expected[i] += mean;
            }
          }
          CHECK(bitwise_equal(e->gather_tensor(p.name, TensorKind::grad), expected));
        }
      }
      const StepResult r = e->step();
      CHECK(r.boundary);
      CHECK(r.applied);
      CHECK(bitwise_equal(e->gather_tensor("odd.w", TensorKind::grad), std::vector<float>(700, 0.0f)));
    }
  }
}
