"""`nvcc_lineinfo_cubin`: one .cu compiled by nvcc for sm_90a with -lineinfo, as a cubin.

    nvcc_lineinfo_cubin(
        name = "decode_attention_kernels_lineinfo",
        src = "//kernels/cuda:decode_attention_kernels.cu",
        deps = ["//kernels/cuda:decode_attention_kernels"],  # headers, includes, defines
    )

The device flags are those of third_party/cuda.bzl's cuda_library (-O3 -std=c++20
--expt-relaxed-constexpr, the same include paths and defines); -lineinfo adds line tables and
changes no instruction, which //tools/sass:cuda_resources checks against the production archive
before it uses the line info. Host code is not compiled (-cubin).
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:defs.bzl", "NVCC")

def _impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    cc = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps]).compilation_context
    out = ctx.actions.declare_file(ctx.label.name + ".cubin")
    args = ctx.actions.args()
    args.add_all(["-cubin", ctx.file.src.path, "-o", out.path])
    args.add_all(["-ccbin", cc_toolchain.compiler_executable])
    args.add_all(["-O3", "-std=c++20", "--expt-relaxed-constexpr", "-lineinfo"])
    args.add_all(["-gencode", "arch=compute_90a,code=sm_90a"])
    args.add_all(["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path])
    args.add_all(cc.includes, format_each = "-I%s")
    args.add_all(cc.quote_includes, format_each = "-I%s")
    args.add_all(cc.system_includes, format_each = "-isystem=%s")
    args.add_all(cc.defines, format_each = "-D%s")
    ctx.actions.run(
        executable = NVCC,
        arguments = [args],
        inputs = depset([ctx.file.src], transitive = [cc.headers]),
        outputs = [out],
        mnemonic = "NvccLineinfo",
        progress_message = "nvcc -lineinfo %s" % ctx.file.src.short_path,
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

nvcc_lineinfo_cubin = rule(
    implementation = _impl,
    attrs = {
        "src": attr.label(allow_single_file = [".cu"], mandatory = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
    incompatible_use_toolchain_transition = True,
)
