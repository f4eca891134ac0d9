// Multi-tensor optimizer updates: many f32 parameter tensors updated by one kernel launch, for
// the backend's fusion of a training step's sgd_update/adamw_update nodes (implemented in
// ops/optim.cu, next to the per-node kernels, which launch the same kernel for one tensor: the
// two paths give the same bits).
//
// Tensor pointers and sizes travel by value in the kernel's parameters, up to
// kMultiTensorCapacity tensors per launch; the launchers split longer lists into several
// launches. Each block updates one chunk of one tensor. lr and step are read on the device inside
// the kernel (never copied to the host), so a captured graph replays with new values. Nothing is
// allocated and the host never waits: the launchers are safe inside a stream capture.
//
// The caller makes the tensors' device current (use_device) and launches on that device's
// stream. The arrays in the argument structs are read during the call only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.hpp"

namespace plexus::cuda {

// Tensors per kernel launch: the kernel parameters stay well under the 4 KiB limit.
constexpr int kMultiTensorCapacity = 48;

// f16's loss scale after a step (docs/ops.md, loss_scale_update): one thread reads the check
// and updates the scale, its inverse, the count of finite steps, the skipped steps and (when
// given) the optimizer's step count, and writes the five-value report. Every pointer is on the
// device; `step` may be null.
struct LossScaleArgs {
  const float* check = nullptr;
  float* scale = nullptr;
  float* unscale = nullptr;
  float* good = nullptr;
  float* skipped = nullptr;
  float* step = nullptr;
  float* report = nullptr;
  float interval = 2000, growth = 2, backoff = 0.5f;
};

// SGD with PyTorch's rule (docs/ops.md, sgd_update): f32 param, grad and momentum buffer; the
// gradients may be f16 or bf16 instead (grad_dtype), widened as they are read: the fusion of a
// mixed-precision step's gradient casts into the update, the same bits as cast then update.
struct MultiSgdArgs {
  int32_t count = 0;                      // tensors; those with 0 elements are skipped
  float* const* param = nullptr;          // [count], updated in place
  const void* const* grad = nullptr;      // [count], of grad_dtype
  int32_t grad_dtype = PLX_F32;           // PLX_F32, PLX_F16 or PLX_BF16
  float* const* momentum_buf = nullptr;   // [count], updated in place; unused (may be null)
                                          // when momentum == 0
  const int64_t* numel = nullptr;         // [count] elements of each tensor
  double momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  const void* lr = nullptr;               // device pointer to one value of lr_dtype
  int32_t lr_dtype = PLX_F32;             // PLX_F32 or PLX_F64
  // Optional device pointer to one f32 (f16's gradient check): no tensor is updated unless it
  // is finite.
  const float* check = nullptr;
  // Optional: the loss scale's update after the step's (the fusion of loss_scale_update into the
  // optimizer's launch), run by the last block to finish, found with `done` (a BlockCounter the
  // caller owns; one launch sequence at a time).
  const LossScaleArgs* scaler = nullptr;
  unsigned* done = nullptr;
};

// AdamW (docs/ops.md, adamw_update): f32 param, grad and moments; gradients as for SGD.
struct MultiAdamwArgs {
  int32_t count = 0;
  float* const* param = nullptr;          // [count], updated in place
  const void* const* grad = nullptr;      // [count], of grad_dtype
  int32_t grad_dtype = PLX_F32;           // PLX_F32, PLX_F16 or PLX_BF16
  float* const* exp_avg = nullptr;        // [count], updated in place
  float* const* exp_avg_sq = nullptr;     // [count], updated in place
  const int64_t* numel = nullptr;         // [count]
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  const void* lr = nullptr;               // device pointer to one value of lr_dtype
  int32_t lr_dtype = PLX_F32;             // PLX_F32 or PLX_F64
  const void* step = nullptr;             // device pointer to one value of step_dtype
  int32_t step_dtype = PLX_F32;           // PLX_F32 or PLX_F64
  const float* check = nullptr;           // as MultiSgdArgs::check
  const LossScaleArgs* scaler = nullptr;  // as MultiSgdArgs::scaler (after step is read)
  unsigned* done = nullptr;
  // The device's error record (CudaBackend::context(device).error_dev): a step below 1 is
  // reported there (kErrAdamStep) and no tensor is updated.
  DeviceErrorRecord* error = nullptr;
};

// Enqueue the updates on `stream`; throw BackendError if a launch fails.
void launch_multi_sgd(const MultiSgdArgs& args, cudaStream_t stream);
void launch_multi_adamw(const MultiAdamwArgs& args, cudaStream_t stream);

// f16's loss scale alone (loss_scale_update's own kernel).
void launch_loss_scale_update(const LossScaleArgs& args, cudaStream_t stream);

}  // namespace plexus::cuda
