// Eager gradients: running an op's gradient formula at once on tensors. The graph builder uses
// the same formulas through its own Emitter.
#pragma once

#include <string_view>
#include <vector>

#include "plexus/attrs.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/tensor.hpp"

namespace plexus {

class Backend;

class EagerEmitter : public Emitter {
 public:
  explicit EagerEmitter(Backend& backend) : backend_(backend) {}
  Var add(const Tensor& t);  // an undefined tensor gives an invalid Var
  const Tensor& get(Var v) const;

  std::vector<Var> emit(std::string_view op, const std::vector<Var>& inputs,
                        const Attrs& attrs) override;
  TensorDesc desc(Var v) const override;
  Var reshape(Var v, const Shape& shape) override;

 private:
  Backend& backend_;
  std::vector<Tensor> values_;
};

// The gradients of `op`'s inputs, given its inputs, outputs and the gradients of its outputs
// (undefined where none flows). `needs` says which inputs want a gradient (default: every input
// that is present and not PLX_ARG_NO_GRAD). Undefined where no gradient is computed. Throws
// OpError if the op is not differentiable.
std::vector<Tensor> call_grad(Backend& backend, std::string_view op,
                              const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& outputs,
                              const std::vector<Tensor>& grad_outputs, const Attrs& attrs = {},
                              std::vector<bool> needs = {});

}  // namespace plexus
