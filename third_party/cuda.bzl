"""`cuda_library`: compiles .cu files with the system nvcc into a target cc rules can depend on.

    cuda_library(
        name = "rmsnorm_cuda",
        srcs = ["rmsnorm.cu"],
        hdrs = ["rmsnorm.h"],
        deps = ["//kernels:op_params"],
    )

Each .cu is compiled whole-program (no relocatable device code) for sm_80 and sm_90a at -O3
into a static archive; the target carries its headers and the CUDA runtime to dependents.

Every CUDA target also has twins that run on the CPU under the project's emulation of CUDA
(kernels/cuda/emu): `X_emu` (ASan + UBSan) and `X_emu_tsan` (ThreadSanitizer), test-only. The
same sources are compiled by g++ with -DSLUICE_CUDA_EMU against the emulation's stand-in
headers (cuda_runtime.h, cub, cublas_v2.h, ...); deps named in `gpu_deps` are replaced by their
twins of the same flavor, and the CUDA toolkit's libraries by the emulation's runtime.

    cuda_library(name, srcs = [.cu], hdrs, deps, gpu_deps)   # nvcc archive + emulated twins
    cuda_cc_library(name, srcs, hdrs, deps, gpu_deps)        # host code calling the runtime
    cuda_cc_test(name, srcs, deps, gpu_deps, emu_args)       # the GPU test + its emulated runs
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

# The CPU emulation's flavors: compile and link flags of the twins.
EMU_FLAVORS = {
    "emu": struct(
        copts = [
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
        ],
        linkopts = ["-fsanitize=address,undefined"],
    ),
    "emu_tsan": struct(
        copts = ["-fsanitize=thread"],
        linkopts = ["-fsanitize=thread"],
    ),
}

_EMU_RUNTIME = "//kernels/cuda/emu:runtime"

# What the toolkit provides and the emulation replaces.
_CUDA_TOOLKIT = [
    "//third_party:cudart",
    "//third_party:cublas",
    "//third_party:cuda_headers",
    "@local_cuda//:cudart",
    "@local_cuda//:cublas",
    "@local_cuda//:headers",
]

def emu_twin(label, flavor):
    """The label of `label`'s twin in `flavor` ("//a:b" -> "//a:b_emu")."""
    return label + "_" + flavor

def _emu_deps(deps, gpu_deps, flavor):
    return [d for d in deps if d not in _CUDA_TOOLKIT] + [emu_twin(d, flavor) for d in gpu_deps] + [_EMU_RUNTIME]

def _emu_copts(flavor):
    # `#pragma unroll` means nothing to g++.
    return EMU_FLAVORS[flavor].copts + ["-DSLUICE_CUDA_EMU", "-include", "cuda_runtime.h", "-Wno-unknown-pragmas"]

def cuda_library(name, srcs, hdrs = [], deps = [], gpu_deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library-compatible target built from .cu sources by nvcc, and its emulated twins."""
    _cuda_archive(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + gpu_deps + ["@local_cuda//:headers"],
        copts = copts,
        # The machine-code gate (//tools/sass) reads the kernels' SASS out of these archives.
        visibility = ["//tools/sass:__pkg__"],
    )
    native.cc_library(
        name = name,
        hdrs = hdrs,
        deps = [":" + name + "_nvcc", "@local_cuda//:cudart"] + gpu_deps,
        visibility = visibility,
        **kwargs
    )

    cuda_emu_library(name, srcs, hdrs, deps, gpu_deps, visibility = visibility)

def cuda_emu_library(name, srcs = [], hdrs = [], deps = [], gpu_deps = [], flavors = None, visibility = None):
    """The emulated twins `name_<flavor>` of a library: .cu sources are compiled as C++ (with
    #line, so diagnostics name the real source), others as they are."""
    emu_srcs = []
    cmds = []
    cu = [s for s in srcs if s.endswith(".cu")]
    for i, src in enumerate(cu):
        out = "_emu_src/%s/%d.cc" % (name, i)
        emu_srcs.append(out)
        cmds.append("(echo '#line 1 \"$(location %s)\"'; cat $(location %s)) > $(location %s)" % (src, src, out))
    if cu:
        native.genrule(
            name = name + "_emu_src",
            srcs = cu,
            outs = emu_srcs,
            cmd = " && ".join(cmds),
            visibility = ["//visibility:private"],
        )
    for flavor in (flavors or EMU_FLAVORS.keys()):
        native.cc_library(
            name = emu_twin(name, flavor),
            srcs = emu_srcs + [s for s in srcs if not s.endswith(".cu")],
            hdrs = hdrs,
            deps = _emu_deps(deps, gpu_deps, flavor),
            copts = _emu_copts(flavor),
            linkopts = EMU_FLAVORS[flavor].linkopts,
            testonly = True,
            visibility = visibility,
        )

def emu_planted_source(name, src, out, after, delete):
    """Copies `src` to `out` without the line containing `delete` that follows the line
    containing `after`; fails unless that happens exactly once (a planted bug must not silently
    become no bug when the source changes)."""
    native.genrule(
        name = name,
        srcs = [src],
        outs = [out],
        cmd = ("awk -v after='%s' -v del='%s' '" +
               "{ if (armed && index($$0, del)) { n++; armed = 0; next } armed = index($$0, after) > 0; print } " +
               "END { if (n != 1) { print \"planted bug: the pattern matched \" n + 0 \" times\" > \"/dev/stderr\"; exit 1 } }' " +
               "$< > $@") % (after, delete),
        testonly = True,
    )

def cuda_cc_library(name, srcs = [], hdrs = [], deps = [], gpu_deps = [], visibility = None, testonly = False, **kwargs):
    """A cc_library of host code that calls the CUDA runtime, and its emulated twins."""
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        deps = deps + gpu_deps,
        visibility = visibility,
        testonly = testonly,
        **kwargs
    )
    for flavor in EMU_FLAVORS:
        native.cc_library(
            name = emu_twin(name, flavor),
            srcs = srcs,
            hdrs = hdrs,
            deps = _emu_deps(deps, gpu_deps, flavor),
            copts = _emu_copts(flavor),
            linkopts = EMU_FLAVORS[flavor].linkopts,
            testonly = True,
            visibility = visibility,
            **kwargs
        )

def cuda_emu_tests(name, srcs, deps = [], gpu_deps = [], emu_args = {}, emu_size = "large", emu_flavors = ["emu", "emu_tsan"], **kwargs):
    """`name_emu` and `name_emu_tsan`: the test sources run on the CPU under the emulation, each
    with `emu_args[flavor]`."""
    for flavor in emu_flavors:
        native.cc_test(
            name = emu_twin(name, flavor),
            srcs = srcs,
            deps = _emu_deps(deps, gpu_deps, flavor),
            copts = _emu_copts(flavor),
            linkopts = EMU_FLAVORS[flavor].linkopts,
            args = emu_args.get(flavor, []),
            size = emu_size,
            **kwargs
        )

def cuda_cc_test(name, srcs, deps = [], gpu_deps = [], emu_args = {}, emu_size = "large", emu_flavors = ["emu", "emu_tsan"], **kwargs):
    """A test of CUDA code: `name` runs on a GPU (and skips, saying why, where there is none);
    its emulated twins (cuda_emu_tests) run it on the CPU."""
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + gpu_deps,
        **kwargs
    )
    cuda_emu_tests(name, srcs, deps, gpu_deps, emu_args, emu_size, emu_flavors, **kwargs)

def cuda_emu_binary(name, srcs, deps = [], gpu_deps = [], flavor = "emu", **kwargs):
    """A test-only binary of `srcs` under the emulation in `flavor` (for tests that run it and
    expect it to fail, such as the planted bugs')."""
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = _emu_deps(deps, gpu_deps, flavor),
        copts = _emu_copts(flavor),
        linkopts = EMU_FLAVORS[flavor].linkopts,
        testonly = True,
        **kwargs
    )
