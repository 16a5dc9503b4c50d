// Shared pieces of the CUDA accumulate and optimizer kernels: storage types by dtype, the dispatch over the
// master's and state's storage, the gradient's dtype and the low-precision param's (or none), and the
// store of a new master weight. Private to kernels/cuda; .cu only.
#pragma once

#include <type_traits>

#include "common.cuh"
#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// The param type of a step that writes no low-precision copy.
struct NoParam {};

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the device storage type of `t`.
template <typename Fn>
void with_device_type(DType t, const Fn& fn) {
  switch (t) {
    case DType::f32:
      fn(TypeTag<float>{});
      return;
    case DType::f16:
      fn(TypeTag<__half>{});
      return;
    case DType::bf16:
      fn(TypeTag<__nv_bfloat16>{});
      return;
  }
}

// Calls fn(TypeTag<G>{}, TypeTag<P>{}) for grad's storage type G and param's P (NoParam when empty).
template <typename Fn>
void with_step_types(ConstBufferView grad, BufferView param, const Fn& fn) {
  with_device_type(grad.dtype, [&](auto grad_tag) {
    if (param.count == 0) {
      fn(grad_tag, TypeTag<NoParam>{});
    } else {
      with_device_type(param.dtype, [&](auto param_tag) { fn(grad_tag, param_tag); });
    }
  });
}

// Calls fn(TypeTag<M>{}, TypeTag<S>{}) for a master and state storage pair that kernels.hpp's
// optimizer_storage_supported allows (checked on the host before: no other pair gets here), so only those
// four pairs are instantiated.
template <typename Fn>
void with_storage_types(DType master, DType state, const Fn& fn) {
  if (state == DType::bf16) {
    fn(TypeTag<__nv_bfloat16>{}, TypeTag<__nv_bfloat16>{});
    return;
  }
  with_device_type(master, [&](auto master_tag) { fn(master_tag, TypeTag<float>{}); });
}

template <typename P>
__device__ __forceinline__ void store_param(P* out, std::size_t i, float v) {
  if constexpr (!std::is_same_v<P, NoParam>) out[i] = store_f32<P>(v);
}

// Stores the new master weight p rounded to M (round to nearest even) and the param copy of the value
// stored (kernels.hpp: param == cast(master)); for fp32 M both are p itself.
template <typename M, typename P>
__device__ __forceinline__ void store_master(M* master, P* out, std::size_t i, float p) {
  const M stored = store_f32<M>(p);
  master[i] = stored;
  store_param(out, i, load_f32(stored));
}

}  // namespace zero3::kernels::gpu
