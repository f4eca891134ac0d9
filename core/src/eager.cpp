#include "plexus/eager.hpp"

#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/error.hpp"
#include "plexus/runtime.hpp"

namespace plexus {

Var EagerEmitter::add(const Tensor& t) {
  if (!t.defined()) return Var{};
  values_.push_back(t);
  return Var{static_cast<int32_t>(values_.size() - 1)};
}

const Tensor& EagerEmitter::get(Var v) const {
  static const Tensor undefined;
  if (!v.valid()) return undefined;
  return values_.at(static_cast<size_t>(v.id));
}

std::vector<Var> EagerEmitter::emit(std::string_view op, const std::vector<Var>& inputs,
                                    const Attrs& attrs) {
  std::vector<Tensor> ts;
  for (Var v : inputs) ts.push_back(get(v));
  std::vector<Var> out;
  for (const Tensor& t : call(backend_, op, ts, attrs)) out.push_back(add(t));
  return out;
}

TensorDesc EagerEmitter::desc(Var v) const {
  if (!v.valid()) return TensorDesc{};
  return get(v).desc();
}

Var EagerEmitter::reshape(Var v, const Shape& shape) { return add(get(v).contiguous().reshape(shape)); }

std::vector<Tensor> call_grad(Backend& backend, std::string_view op,
                              const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& outputs,
                              const std::vector<Tensor>& grad_outputs, const Attrs& attrs,
                              std::vector<bool> needs) {
  const OpSchema& s = backend.runtime().ops().get(op);
  if (!s.grad) throw OpError("op '" + s.name + "' is not differentiable");
  const Attrs full = s.complete_attrs(attrs);
  EagerEmitter e(backend);
  std::vector<Var> in, out, gout;
  for (size_t i = 0; i < s.inputs.size(); ++i) in.push_back(e.add(i < inputs.size() ? inputs[i] : Tensor()));
  for (size_t i = 0; i < s.outputs.size(); ++i)
    out.push_back(e.add(i < outputs.size() ? outputs[i] : Tensor()));
  for (size_t i = 0; i < s.outputs.size(); ++i)
    gout.push_back(e.add(i < grad_outputs.size() ? grad_outputs[i] : Tensor()));
  if (needs.empty()) {
    for (size_t i = 0; i < s.inputs.size(); ++i)
      needs.push_back(in[i].valid() && !(s.inputs[i].flags & PLX_ARG_NO_GRAD));
  }
  needs.resize(s.inputs.size(), false);
  GradContext ctx(e, s, full, in, out, gout, needs);
  s.grad(ctx);
  std::vector<Tensor> grads;
  for (Var g : ctx.grads()) grads.push_back(e.get(g));
  return grads;
}

}  // namespace plexus
