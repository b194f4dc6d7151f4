"""`cuda_library`: compiles .cu files with the system nvcc into a target cc rules can depend on.

    cuda_library(
        name = "rmsnorm_cuda",
        srcs = ["rmsnorm.cu"],
        hdrs = ["rmsnorm.h"],
        deps = ["//kernels:op_params"],
    )

Each .cu is compiled whole-program (no relocatable device code) for sm_80 and sm_90a at -O3
into a static archive; the target carries its headers and the CUDA runtime to dependents.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@local_cuda//:defs.bzl", "NVCC")

CUDA_ARCHS = ["80", "90a"]

def _cuda_archive_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    deps_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    deps_ctx = deps_info.compilation_context

    include_flags = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    include_flags += ["-I" + p for p in deps_ctx.includes.to_list()]
    include_flags += ["-I" + p for p in deps_ctx.quote_includes.to_list()]
    include_flags += ["-isystem=" + p for p in deps_ctx.system_includes.to_list()]
    define_flags = ["-D" + d for d in deps_ctx.defines.to_list()]
    arch_flags = []
    for arch in CUDA_ARCHS:
        arch_flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]

    header_inputs = depset(ctx.files.hdrs, transitive = [deps_ctx.headers])
    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_cuda_objs/%s/%s.o" % (ctx.label.name, src.basename))
        args = ctx.actions.args()
        args.add_all(["-c", src.path, "-o", obj.path])
        args.add_all(["-ccbin", cc_toolchain.compiler_executable])
        args.add_all(["-O3", "-std=c++20", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr"])
        args.add_all(arch_flags)
        args.add_all(include_flags)
        args.add_all(define_flags)
        args.add_all(ctx.attr.copts)
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [header_inputs]),
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)

    archive = ctx.actions.declare_file("lib%s.a" % ctx.label.name)
    ar_args = ctx.actions.args()
    ar_args.add_all(["rcsD", archive.path])
    ar_args.add_all(objects)
    ctx.actions.run(
        executable = cc_toolchain.ar_executable,
        arguments = [ar_args],
        inputs = objects,
        outputs = [archive],
        mnemonic = "CudaArchive",
        progress_message = "archiving %s" % archive.short_path,
    )

    library = cc_common.create_library_to_link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        static_library = archive,
        alwayslink = ctx.attr.alwayslink,
    )
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset([cc_common.create_linker_input(
            owner = ctx.label,
            libraries = depset([library]),
        )]),
    )
    own = CcInfo(
        compilation_context = cc_common.create_compilation_context(headers = depset(ctx.files.hdrs)),
        linking_context = linking_context,
    )
    return [
        DefaultInfo(files = depset([archive])),
        cc_common.merge_cc_infos(direct_cc_infos = [own], cc_infos = [deps_info]),
    ]

_cuda_archive = rule(
    implementation = _cuda_archive_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "alwayslink": attr.bool(default = False),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    fragments = ["cpp"],
    incompatible_use_toolchain_transition = True,
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library-compatible target built from .cu sources by nvcc."""
    _cuda_archive(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:headers"],
        copts = copts,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        hdrs = hdrs,
        deps = [":" + name + "_nvcc", "@local_cuda//:cudart"],
        visibility = visibility,
        **kwargs
    )
