#!/usr/bin/env python3
"""Rewrites a CUDA source of the plugin into C++ for the CUDA emulator (tests/cuda/emu/README.md).

Two constructs are not C++: a launch, `kernel<targs><<<grid, block, smem, stream>>>(args);`,
becomes `::plx_emu::launch("kernel<targs>", &kernel<targs>, ::plx_emu::Config(grid, block,
smem, stream), args);`, and a dynamic shared-memory array, `extern __shared__ T name[];` (on a
line of its own), becomes a pointer to the launch's dynamic shared memory (a local variable in
a function, a macro at namespace scope). The plugin's own launches go through its helper,
`launch_kernel(kernel<targs>, grid, block, smem, stream, args)` (device.cuh), which calls
cudaLaunchKernelEx: that stays as it is, named for the emulator's trace by
`(::plx_emu::name_next_launch("kernel<targs>"), launch_kernel(...))`. The headers of inline PTX,
ops/mma_ptx.cuh and ops/wgmma_ptx.cuh, are replaced by the emulator's plx_emu_ptx.hpp and
plx_emu_wgmma.hpp. Everything else (keywords, built-in indices, intrinsics) is defined by the
emulator's headers. Line numbers are kept, so compiler errors point at the original file.

usage: translate.py IN.cu OUT.cpp
"""
import re
import sys


def find_kernel_start(s, i):
    """The start of the kernel expression that ends just before index i (at `<<<`)."""
    j = i
    while j > 0 and s[j - 1].isspace():
        j -= 1
    if s[j - 1] == ">":  # template arguments: match the angle brackets backwards
        depth = 0
        k = j - 1
        while k >= 0:
            if s[k] == ">":
                depth += 1
            elif s[k] == "<":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        j = k
    k = j
    while k > 0 and (s[k - 1].isalnum() or s[k - 1] in "_:"):
        k -= 1
    return k


def matching(s, i, open_ch, close_ch):
    depth = 0
    for k in range(i, len(s)):
        if s[k] == open_ch:
            depth += 1
        elif s[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k
    raise SystemExit(f"unbalanced {open_ch}{close_ch} from offset {i}")


def rewrite_launches(s):
    out = []
    pos = 0
    while True:
        i = s.find("<<<", pos)
        if i < 0:
            out.append(s[pos:])
            return "".join(out)
        start = find_kernel_start(s, i)
        kernel = s[start:i].rstrip()
        end_cfg = s.find(">>>", i)
        cfg = s[i + 3:end_cfg]
        lp = end_cfg + 3
        while s[lp].isspace():
            lp += 1
        if s[lp] != "(":
            raise SystemExit(f"no argument list after >>> at offset {end_cfg}")
        rp = matching(s, lp, "(", ")")
        args = s[lp + 1:rp]
        name = " ".join(kernel.split())
        call = (f'::plx_emu::launch("{name}", &{kernel}, ::plx_emu::Config({cfg})'
                + (f", {args})" if args.strip() else ")"))
        # Keep the line count: the rewritten launch spans as many lines as the original did.
        lines = s[start:rp + 1].count("\n")
        call = call.replace("\n", " ") + "\n" * lines
        out.append(s[pos:start])
        out.append(call)
        pos = rp + 1


LAUNCH_KERNEL = re.compile(r"(?<![\w:.>])launch_kernel\(")


def kernel_expression_end(s, i):
    """The end of the kernel expression (a name, maybe qualified, with template arguments) that
    starts at index i."""
    k = i
    while k < len(s) and (s[k].isalnum() or s[k] in "_:"):
        k += 1
    j = k
    while j < len(s) and s[j].isspace():
        j += 1
    if j < len(s) and s[j] == "<":
        depth = 0
        for k in range(j, len(s)):
            if s[k] in "<(":
                depth += 1
            elif s[k] in ">)":
                depth -= 1
                if depth == 0:
                    return k + 1
        raise SystemExit(f"unbalanced template arguments from offset {j}")
    return k


def name_kernel_launches(s):
    """`launch_kernel(kernel<targs>, ...)` (the plugin's launch helper, device.cuh) becomes
    `(::plx_emu::name_next_launch("kernel<targs>"), launch_kernel(kernel<targs>, ...))`: the helper
    runs as written, and the emulated cudaLaunchKernelEx it calls traces the kernel by its name."""
    out = []
    pos = 0
    for m in LAUNCH_KERNEL.finditer(s):
        line_start = s.rfind("\n", 0, m.start()) + 1
        if "//" in s[line_start:m.start()]:
            continue  # in a comment
        lp = m.end() - 1
        a = lp + 1
        while s[a].isspace():
            a += 1
        name = " ".join(s[a:kernel_expression_end(s, a)].split())
        rp = matching(s, lp, "(", ")")
        out.append(s[pos:m.start()])
        out.append(f'(::plx_emu::name_next_launch("{name}"), ' + s[m.start():rp + 1] + ")")
        pos = rp + 1
    out.append(s[pos:])
    return "".join(out)


SHARED = re.compile(
    r"^([ \t]*)extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w:]+(?:\s+[\w:]+)*)\s+"
    r"(?:__align__\(\s*\d+\s*\)\s+)?(\w+)\s*\[\s*\]\s*;", re.M)


def shared_declaration(m):
    """In a function (an indented line), a local pointer to the launch's dynamic shared memory. At
    namespace scope (column 0, as the plugin's style puts it) a pointer would be initialised once,
    before any launch, so there it is a macro (an identical redefinition is allowed)."""
    indent, type_, name = m.group(1), m.group(2), m.group(3)
    pointer = f"static_cast<{type_}*>(::plx_emu::dynamic_smem())"
    if indent:
        return f"{indent}{type_}* {name} = {pointer};"
    return f"#define {name} ({pointer})"


# Headers of inline PTX, and the emulator's versions of them (include/).
EMULATED_HEADERS = {
    "ops/mma_ptx.cuh": "plx_emu_ptx.hpp",
    "ops/wgmma_ptx.cuh": "plx_emu_wgmma.hpp",
}


def main():
    src, dst = sys.argv[1], sys.argv[2]
    s = open(src).read()
    s = rewrite_launches(s)
    s = name_kernel_launches(s)
    s = SHARED.sub(shared_declaration, s)
    for header, emulated in EMULATED_HEADERS.items():
        s = s.replace(f'#include "{header}"', f'#include "{emulated}"')
    with open(dst, "w") as f:
        f.write(f'#line 1 "{src}"\n' + s)


main()
