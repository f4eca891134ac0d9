// Pins the layout of every struct of plugin ABI 1.2 (x86-64 / LP64).
//
// Once released an ABI header is frozen: a field may only be appended (with the minor version
// bumped), never inserted, resized or reordered, or plugins built earlier would read the wrong
// slots. If one of these assertions fails, the change broke the ABI: undo it, or append the
// field at the end, bump PLX_ABI_MINOR and add the new size here as a new line.
//
// History: 1.1 appended plx_comm.bench_native (plx_comm 160 -> 168 bytes; a 1.0 table of 160
// bytes stays valid, PLX_COMM_SIZE_1_0). 1.2 appended plx_plugin's kernel extensions,
// extension_kernel_count and get_extension_kernel (plx_plugin 104 -> 120 bytes; a descriptor of
// 1.0 or 1.1, 104 bytes, stays valid, PLX_PLUGIN_SIZE_1_0 = PLX_PLUGIN_SIZE_1_1), and the new
// struct plx_kernel_ext.
//
// The static_asserts fail the build; the test case repeats them at run time so the suite lists
// the check and reports each struct.
#include <cstddef>
#include <string>

#include "plexus/plexus.h"
#include "support/catch.hpp"

static_assert(sizeof(void*) == 8, "the pinned layout is for 64-bit targets");

#define PLX_PIN_SIZE(T, size, align) \
  static_assert(sizeof(T) == (size), #T " changed size");  \
  static_assert(alignof(T) == (align), #T " changed alignment");
#define PLX_PIN_FIELD(T, field, offset) \
  static_assert(offsetof(T, field) == (offset), #T "." #field " moved");

PLX_PIN_SIZE(plx_tensor, 152, 8)
PLX_PIN_FIELD(plx_tensor, data, 0)
PLX_PIN_FIELD(plx_tensor, dtype, 8)
PLX_PIN_FIELD(plx_tensor, ndim, 12)
PLX_PIN_FIELD(plx_tensor, shape, 16)
PLX_PIN_FIELD(plx_tensor, strides, 80)
PLX_PIN_FIELD(plx_tensor, device, 144)
PLX_PIN_FIELD(plx_tensor, mem_kind, 148)
PLX_PIN_SIZE(plx_attr, 56, 8)
PLX_PIN_FIELD(plx_attr, name, 0)
PLX_PIN_FIELD(plx_attr, type, 8)
PLX_PIN_FIELD(plx_attr, count, 12)
PLX_PIN_FIELD(plx_attr, i, 16)
PLX_PIN_FIELD(plx_attr, f, 24)
PLX_PIN_FIELD(plx_attr, ints, 32)
PLX_PIN_FIELD(plx_attr, floats, 40)
PLX_PIN_FIELD(plx_attr, s, 48)
PLX_PIN_SIZE(plx_node_info, 56, 8)
PLX_PIN_FIELD(plx_node_info, struct_size, 0)
PLX_PIN_FIELD(plx_node_info, device, 4)
PLX_PIN_FIELD(plx_node_info, op, 8)
PLX_PIN_FIELD(plx_node_info, num_inputs, 16)
PLX_PIN_FIELD(plx_node_info, num_outputs, 20)
PLX_PIN_FIELD(plx_node_info, inputs, 24)
PLX_PIN_FIELD(plx_node_info, outputs, 32)
PLX_PIN_FIELD(plx_node_info, attrs, 40)
PLX_PIN_FIELD(plx_node_info, num_attrs, 48)
PLX_PIN_FIELD(plx_node_info, reserved0, 52)
PLX_PIN_SIZE(plx_kernel, 64, 8)
PLX_PIN_FIELD(plx_kernel, struct_size, 0)
PLX_PIN_FIELD(plx_kernel, flags, 4)
PLX_PIN_FIELD(plx_kernel, op, 8)
PLX_PIN_FIELD(plx_kernel, impl, 16)
PLX_PIN_FIELD(plx_kernel, dtype, 24)
PLX_PIN_FIELD(plx_kernel, layout, 28)
PLX_PIN_FIELD(plx_kernel, user, 32)
PLX_PIN_FIELD(plx_kernel, create, 40)
PLX_PIN_FIELD(plx_kernel, compute, 48)
PLX_PIN_FIELD(plx_kernel, destroy, 56)
PLX_PIN_SIZE(plx_arg_def, 16, 8)
PLX_PIN_FIELD(plx_arg_def, name, 0)
PLX_PIN_FIELD(plx_arg_def, flags, 8)
PLX_PIN_FIELD(plx_arg_def, dtypes, 12)
PLX_PIN_SIZE(plx_attr_def, 72, 8)
PLX_PIN_FIELD(plx_attr_def, name, 0)
PLX_PIN_FIELD(plx_attr_def, type, 8)
PLX_PIN_FIELD(plx_attr_def, required, 12)
PLX_PIN_FIELD(plx_attr_def, default_value, 16)
PLX_PIN_SIZE(plx_op_schema, 88, 8)
PLX_PIN_FIELD(plx_op_schema, struct_size, 0)
PLX_PIN_FIELD(plx_op_schema, type_input, 4)
PLX_PIN_FIELD(plx_op_schema, name, 8)
PLX_PIN_FIELD(plx_op_schema, doc, 16)
PLX_PIN_FIELD(plx_op_schema, inputs, 24)
PLX_PIN_FIELD(plx_op_schema, outputs, 32)
PLX_PIN_FIELD(plx_op_schema, attrs, 40)
PLX_PIN_FIELD(plx_op_schema, num_inputs, 48)
PLX_PIN_FIELD(plx_op_schema, num_outputs, 52)
PLX_PIN_FIELD(plx_op_schema, num_attrs, 56)
PLX_PIN_FIELD(plx_op_schema, reserved0, 60)
PLX_PIN_FIELD(plx_op_schema, user, 64)
PLX_PIN_FIELD(plx_op_schema, infer, 72)
PLX_PIN_FIELD(plx_op_schema, grad_op, 80)
PLX_PIN_SIZE(plx_device_props, 176, 8)
PLX_PIN_FIELD(plx_device_props, struct_size, 0)
PLX_PIN_FIELD(plx_device_props, index, 4)
PLX_PIN_FIELD(plx_device_props, name, 8)
PLX_PIN_FIELD(plx_device_props, total_memory, 136)
PLX_PIN_FIELD(plx_device_props, free_memory, 144)
PLX_PIN_FIELD(plx_device_props, compute_units, 152)
PLX_PIN_FIELD(plx_device_props, arch_major, 156)
PLX_PIN_FIELD(plx_device_props, arch_minor, 160)
PLX_PIN_FIELD(plx_device_props, caps, 164)
PLX_PIN_FIELD(plx_device_props, alignment, 168)
PLX_PIN_SIZE(plx_memory_stats, 80, 8)
PLX_PIN_FIELD(plx_memory_stats, struct_size, 0)
PLX_PIN_FIELD(plx_memory_stats, reserved0, 4)
PLX_PIN_FIELD(plx_memory_stats, in_use, 8)
PLX_PIN_FIELD(plx_memory_stats, peak_in_use, 16)
PLX_PIN_FIELD(plx_memory_stats, reserved, 24)
PLX_PIN_FIELD(plx_memory_stats, peak_reserved, 32)
PLX_PIN_FIELD(plx_memory_stats, limit, 40)
PLX_PIN_FIELD(plx_memory_stats, num_allocs, 48)
PLX_PIN_FIELD(plx_memory_stats, num_cache_hits, 56)
PLX_PIN_FIELD(plx_memory_stats, num_raw_allocs, 64)
PLX_PIN_FIELD(plx_memory_stats, num_ooms, 72)
PLX_PIN_SIZE(plx_graph_node, 48, 8)
PLX_PIN_FIELD(plx_graph_node, op, 0)
PLX_PIN_FIELD(plx_graph_node, inputs, 8)
PLX_PIN_FIELD(plx_graph_node, outputs, 16)
PLX_PIN_FIELD(plx_graph_node, attrs, 24)
PLX_PIN_FIELD(plx_graph_node, num_inputs, 32)
PLX_PIN_FIELD(plx_graph_node, num_outputs, 36)
PLX_PIN_FIELD(plx_graph_node, num_attrs, 40)
PLX_PIN_FIELD(plx_graph_node, kernel_hint, 44)
PLX_PIN_SIZE(plx_graph_view, 32, 8)
PLX_PIN_FIELD(plx_graph_view, struct_size, 0)
PLX_PIN_FIELD(plx_graph_view, device, 4)
PLX_PIN_FIELD(plx_graph_view, values, 8)
PLX_PIN_FIELD(plx_graph_view, nodes, 16)
PLX_PIN_FIELD(plx_graph_view, num_values, 24)
PLX_PIN_FIELD(plx_graph_view, num_nodes, 28)
PLX_PIN_SIZE(plx_backend, 240, 8)
PLX_PIN_FIELD(plx_backend, struct_size, 0)
PLX_PIN_FIELD(plx_backend, reserved0, 4)
PLX_PIN_FIELD(plx_backend, name, 8)
PLX_PIN_FIELD(plx_backend, ctx, 16)
PLX_PIN_FIELD(plx_backend, device_count, 24)
PLX_PIN_FIELD(plx_backend, device_props, 32)
PLX_PIN_FIELD(plx_backend, mem_alloc, 40)
PLX_PIN_FIELD(plx_backend, mem_free, 48)
PLX_PIN_FIELD(plx_backend, mem_copy, 56)
PLX_PIN_FIELD(plx_backend, mem_set, 64)
PLX_PIN_FIELD(plx_backend, mem_info, 72)
PLX_PIN_FIELD(plx_backend, stream_create, 80)
PLX_PIN_FIELD(plx_backend, stream_destroy, 88)
PLX_PIN_FIELD(plx_backend, stream_sync, 96)
PLX_PIN_FIELD(plx_backend, stream_wait_event, 104)
PLX_PIN_FIELD(plx_backend, event_create, 112)
PLX_PIN_FIELD(plx_backend, event_destroy, 120)
PLX_PIN_FIELD(plx_backend, event_record, 128)
PLX_PIN_FIELD(plx_backend, event_sync, 136)
PLX_PIN_FIELD(plx_backend, event_query, 144)
PLX_PIN_FIELD(plx_backend, event_elapsed_ms, 152)
PLX_PIN_FIELD(plx_backend, kernel_count, 160)
PLX_PIN_FIELD(plx_backend, get_kernel, 168)
PLX_PIN_FIELD(plx_backend, get_capability, 176)
PLX_PIN_FIELD(plx_backend, create_fused, 184)
PLX_PIN_FIELD(plx_backend, capture_begin, 192)
PLX_PIN_FIELD(plx_backend, capture_end, 200)
PLX_PIN_FIELD(plx_backend, graph_launch, 208)
PLX_PIN_FIELD(plx_backend, graph_destroy, 216)
PLX_PIN_FIELD(plx_backend, stream_native, 224)
PLX_PIN_FIELD(plx_backend, get_proc_address, 232)
PLX_PIN_SIZE(plx_comm_id, 128, 1)
PLX_PIN_FIELD(plx_comm_id, bytes, 0)
PLX_PIN_SIZE(plx_comm_config, 160, 8)
PLX_PIN_FIELD(plx_comm_config, struct_size, 0)
PLX_PIN_FIELD(plx_comm_config, rank, 4)
PLX_PIN_FIELD(plx_comm_config, size, 8)
PLX_PIN_FIELD(plx_comm_config, device, 12)
PLX_PIN_FIELD(plx_comm_config, backend, 16)
PLX_PIN_FIELD(plx_comm_config, id, 24)
PLX_PIN_FIELD(plx_comm_config, timeout_ms, 152)
PLX_PIN_FIELD(plx_comm_config, reserved0, 156)
PLX_PIN_SIZE(plx_comm, 168, 8)
PLX_PIN_FIELD(plx_comm, struct_size, 0)
PLX_PIN_FIELD(plx_comm, reserved0, 4)
PLX_PIN_FIELD(plx_comm, name, 8)
PLX_PIN_FIELD(plx_comm, backends, 16)
PLX_PIN_FIELD(plx_comm, ctx, 24)
PLX_PIN_FIELD(plx_comm, get_unique_id, 32)
PLX_PIN_FIELD(plx_comm, init_rank, 40)
PLX_PIN_FIELD(plx_comm, destroy, 48)
PLX_PIN_FIELD(plx_comm, abort, 56)
PLX_PIN_FIELD(plx_comm, rank, 64)
PLX_PIN_FIELD(plx_comm, size, 72)
PLX_PIN_FIELD(plx_comm, all_reduce, 80)
PLX_PIN_FIELD(plx_comm, broadcast, 88)
PLX_PIN_FIELD(plx_comm, all_gather, 96)
PLX_PIN_FIELD(plx_comm, reduce_scatter, 104)
PLX_PIN_FIELD(plx_comm, send, 112)
PLX_PIN_FIELD(plx_comm, recv, 120)
PLX_PIN_FIELD(plx_comm, barrier, 128)
PLX_PIN_FIELD(plx_comm, group_begin, 136)
PLX_PIN_FIELD(plx_comm, group_end, 144)
PLX_PIN_FIELD(plx_comm, get_async_error, 152)
static_assert(PLX_COMM_SIZE_1_0 == 160, "plx_comm of ABI 1.0 was 160 bytes");
PLX_PIN_FIELD(plx_comm, bench_native, 160)  // 1.1
PLX_PIN_SIZE(plx_option, 16, 8)
PLX_PIN_FIELD(plx_option, key, 0)
PLX_PIN_FIELD(plx_option, value, 8)
PLX_PIN_SIZE(plx_host, 40, 8)
PLX_PIN_FIELD(plx_host, struct_size, 0)
PLX_PIN_FIELD(plx_host, abi_major, 4)
PLX_PIN_FIELD(plx_host, abi_minor, 6)
PLX_PIN_FIELD(plx_host, log, 8)
PLX_PIN_FIELD(plx_host, log_user, 16)
PLX_PIN_FIELD(plx_host, log_level, 24)
PLX_PIN_FIELD(plx_host, num_options, 28)
PLX_PIN_FIELD(plx_host, options, 32)
PLX_PIN_SIZE(plx_kernel_ext, 24, 8)  // 1.2
PLX_PIN_FIELD(plx_kernel_ext, struct_size, 0)
PLX_PIN_FIELD(plx_kernel_ext, reserved0, 4)
PLX_PIN_FIELD(plx_kernel_ext, backend, 8)
PLX_PIN_FIELD(plx_kernel_ext, kernel, 16)
PLX_PIN_SIZE(plx_plugin, 120, 8)
PLX_PIN_FIELD(plx_plugin, struct_size, 0)
PLX_PIN_FIELD(plx_plugin, abi_major, 4)
PLX_PIN_FIELD(plx_plugin, abi_minor, 6)
PLX_PIN_FIELD(plx_plugin, name, 8)
PLX_PIN_FIELD(plx_plugin, version, 16)
PLX_PIN_FIELD(plx_plugin, description, 24)
PLX_PIN_FIELD(plx_plugin, init, 32)
PLX_PIN_FIELD(plx_plugin, shutdown, 40)
PLX_PIN_FIELD(plx_plugin, last_error, 48)
PLX_PIN_FIELD(plx_plugin, backend_count, 56)
PLX_PIN_FIELD(plx_plugin, get_backend, 64)
PLX_PIN_FIELD(plx_plugin, comm_count, 72)
PLX_PIN_FIELD(plx_plugin, get_comm, 80)
PLX_PIN_FIELD(plx_plugin, op_schema_count, 88)
PLX_PIN_FIELD(plx_plugin, get_op_schema, 96)
static_assert(PLX_PLUGIN_SIZE_1_0 == 104, "plx_plugin of ABI 1.0 was 104 bytes");
static_assert(PLX_PLUGIN_SIZE_1_1 == 104, "plx_plugin of ABI 1.1 was 104 bytes");
PLX_PIN_FIELD(plx_plugin, extension_kernel_count, 104)  // 1.2
PLX_PIN_FIELD(plx_plugin, get_extension_kernel, 112)    // 1.2

namespace {

struct Pin {
  const char* name;
  size_t size, expected;
};

}  // namespace

TEST_CASE("ABI 1.2 struct sizes are pinned", "[abi]") {
  const Pin pins[] = {
      {"plx_tensor", sizeof(plx_tensor), 152},
      {"plx_attr", sizeof(plx_attr), 56},
      {"plx_node_info", sizeof(plx_node_info), 56},
      {"plx_kernel", sizeof(plx_kernel), 64},
      {"plx_arg_def", sizeof(plx_arg_def), 16},
      {"plx_attr_def", sizeof(plx_attr_def), 72},
      {"plx_op_schema", sizeof(plx_op_schema), 88},
      {"plx_device_props", sizeof(plx_device_props), 176},
      {"plx_memory_stats", sizeof(plx_memory_stats), 80},
      {"plx_graph_node", sizeof(plx_graph_node), 48},
      {"plx_graph_view", sizeof(plx_graph_view), 32},
      {"plx_backend", sizeof(plx_backend), 240},
      {"plx_comm_id", sizeof(plx_comm_id), 128},
      {"plx_comm_config", sizeof(plx_comm_config), 160},
      {"plx_comm", sizeof(plx_comm), 168},
      {"plx_comm of ABI 1.0", PLX_COMM_SIZE_1_0, 160},
      {"plx_option", sizeof(plx_option), 16},
      {"plx_host", sizeof(plx_host), 40},
      {"plx_kernel_ext", sizeof(plx_kernel_ext), 24},
      {"plx_plugin", sizeof(plx_plugin), 120},
      {"plx_plugin of ABI 1.0", PLX_PLUGIN_SIZE_1_0, 104},
      {"plx_plugin of ABI 1.1", PLX_PLUGIN_SIZE_1_1, 104},
  };
  for (const Pin& p : pins) {
    INFO(p.name);
    CHECK(p.size == p.expected);
  }
}

// 1.3 to 1.6 changed no layout (max_pool2d's relu_mask, the updates' check input,
// loss_scale_update, the layout contract, PLX_KERNEL_DENSE and PLX_KERNEL_SELF_CONTAINED are op and
// kernel contracts: the host gates them by the plugin's minor), so the 1.2 pins above hold for them.
TEST_CASE("ABI 1.6 enumerations keep their values", "[abi]") {
  CHECK(PLX_ABI_MAJOR == 1);
  CHECK(PLX_ABI_MINOR == 6);
  CHECK(PLX_MAX_DIMS == 8);
  CHECK(PLX_OK == 0);
  CHECK(PLX_ERR_INVALID_ARGUMENT == 1);
  CHECK(PLX_ERR_UNSUPPORTED == 2);
  CHECK(PLX_ERR_OUT_OF_MEMORY == 3);
  CHECK(PLX_ERR_BACKEND == 4);
  CHECK(PLX_ERR_COMM == 5);
  CHECK(PLX_ERR_TIMEOUT == 6);
  CHECK(PLX_ERR_ABORTED == 7);
  CHECK(PLX_ERR_NOT_FOUND == 8);
  CHECK(PLX_ERR_INTERNAL == 9);
  CHECK(PLX_DTYPE_NONE == -1);
  CHECK(PLX_F32 == 0);
  CHECK(PLX_F16 == 1);
  CHECK(PLX_BF16 == 2);
  CHECK(PLX_I32 == 3);
  CHECK(PLX_I64 == 4);
  CHECK(PLX_U8 == 5);
  CHECK(PLX_F64 == 6);
  CHECK(PLX_MEM_DEVICE == 0);
  CHECK(PLX_MEM_PINNED == 1);
  CHECK(PLX_MEM_MANAGED == 2);
  CHECK(PLX_COPY_H2D == 0);
  CHECK(PLX_COPY_D2H == 1);
  CHECK(PLX_COPY_D2D == 2);
  CHECK(PLX_COPY_H2H == 3);
  CHECK(PLX_ATTR_INT == 1);
  CHECK(PLX_ATTR_STRING == 5);
  CHECK(PLX_REDUCE_SUM == 0);
  CHECK(PLX_REDUCE_AVG == 1);
  CHECK(PLX_REDUCE_MAX == 2);
  CHECK(PLX_REDUCE_MIN == 3);
  CHECK(PLX_COLL_ALL_REDUCE == 0);
  CHECK(PLX_COLL_BROADCAST == 1);
  CHECK(PLX_COLL_ALL_GATHER == 2);
  CHECK(PLX_COLL_REDUCE_SCATTER == 3);
  CHECK(std::string(plx_collective_string(PLX_COLL_REDUCE_SCATTER)) == "reduce_scatter");
  CHECK(std::string(plx_collective_string(4)) == "invalid");
  CHECK(PLX_LOG_TRACE == 0);
  CHECK(PLX_LOG_OFF == 5);
  CHECK(PLX_KERNEL_LIBRARY == 16);
  CHECK(PLX_KERNEL_DENSE == 32);
  CHECK(PLX_KERNEL_SELF_CONTAINED == 64);
  CHECK(PLX_LAYOUT_ANY == 0);
  CHECK(PLX_LAYOUT_NCHW == 1);
  CHECK(PLX_LAYOUT_NHWC == 2);
}

TEST_CASE("every status has a name", "[abi]") {
  for (int s = PLX_OK; s <= PLX_ERR_INTERNAL; ++s)
    CHECK(std::string(plx_status_string(static_cast<plx_status>(s))) != "unknown status");
  CHECK(std::string(plx_status_string(static_cast<plx_status>(1000))) == "unknown status");
}
