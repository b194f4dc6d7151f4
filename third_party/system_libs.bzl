"""Repository rules wrapping libraries installed from Debian packages as cc_library targets.

`pkg_config_library` asks pkg-config for a module's flags when the workspace loads: `-D` flags
become `defines`, `-I` directories outside /usr/include are linked into the repository and
become `includes`, everything else becomes `linkopts`. `local_cuda` wraps the CUDA toolkit.
When something is missing the build stops with a message naming the Debian package to install
(tools/setup.sh installs them all).
"""

_SYSTEM_INCLUDE_DIRS = ["/usr/include", "/usr/local/include", "/usr/include/x86_64-linux-gnu"]

def _split_flags(text):
    return [t for t in text.replace("\n", " ").split(" ") if t]

def _pkg_config_library_impl(rctx):
    pkg_config = rctx.which("pkg-config")
    if not pkg_config:
        fail("pkg-config is not installed; run tools/setup.sh")
    defines = []
    includes = []
    linkopts = []
    for module in rctx.attr.modules:
        res = rctx.execute([pkg_config, "--cflags", "--libs", module])
        if res.return_code != 0:
            fail("pkg-config cannot find '%s' (Debian package %s); run tools/setup.sh\n%s" %
                 (module, rctx.attr.debian_package, res.stderr))
        for flag in _split_flags(res.stdout):
            if flag.startswith("-D"):
                if flag[2:] not in defines:
                    defines.append(flag[2:])
            elif flag.startswith("-I"):
                path = flag[2:].rstrip("/")
                if path in _SYSTEM_INCLUDE_DIRS:
                    continue
                link = "include_%d" % len(includes)
                rctx.symlink(path, link)
                includes.append(link)
            elif flag not in linkopts or flag.startswith("-Wl,"):
                linkopts.append(flag)
    for header in rctx.attr.check_headers:
        if not rctx.path("/usr/include/" + header).exists:
            fail("header /usr/include/%s is missing (Debian package %s); run tools/setup.sh" %
                 (header, rctx.attr.debian_package))
    linkopts.extend(rctx.attr.extra_linkopts)
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD", """# Generated from pkg-config {modules}.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "lib",
    hdrs = glob(["{globs}"], allow_empty = True),
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)
""".format(
        modules = " ".join(rctx.attr.modules),
        globs = "\", \"".join([i + "/**" for i in includes]) if includes else "none/**",
        includes = repr(includes),
        defines = repr(defines),
        linkopts = repr(linkopts),
    ))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {
        "modules": attr.string_list(mandatory = True),
        "debian_package": attr.string(mandatory = True),
        "check_headers": attr.string_list(),
        "extra_linkopts": attr.string_list(),
    },
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)

def _local_cuda_impl(rctx):
    root = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    nvcc = rctx.path(root + "/bin/nvcc")
    if not nvcc.exists:
        fail("CUDA toolkit not found: %s does not exist (set CUDA_PATH)" % nvcc)
    rctx.symlink(root + "/include", "include")
    rctx.symlink(root + "/lib64", "lib64")
    lib = root + "/lib64"
    rctx.file("WORKSPACE", "workspace(name = \"local_cuda\")\n")
    rctx.file("defs.bzl", "NVCC = \"%s\"\nCUDA_ROOT = \"%s\"\n" % (nvcc, root))
    rctx.file("BUILD", """# Generated: the CUDA toolkit at {root}.
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

# Headers of the CUDA runtime, cuBLAS and NCCL (not the device libraries' C++ trees).
cc_library(
    name = "headers",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**"]),
    includes = ["include"],
)

# The CUDA runtime, linked statically so binaries carry it to the GPU machine; it loads the
# driver (libcuda.so) at run time and reports "no device" cleanly where there is none.
cc_library(
    name = "cudart",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    deps = [":headers"],
)

cc_library(
    name = "cublas",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublas", "-lcublasLt"],
    deps = [":cudart"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
    deps = [":cudart"],
)
""".format(root = root, lib = lib))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH"],
    local = True,
)

_ABSL_MODULES = [
    "absl_base",
    "absl_cleanup",
    "absl_flags",
    "absl_flags_parse",
    "absl_flags_usage",
    "absl_flat_hash_map",
    "absl_flat_hash_set",
    "absl_hash",
    "absl_inlined_vector",
    "absl_node_hash_map",
    "absl_random_random",
    "absl_span",
    "absl_status",
    "absl_statusor",
    "absl_str_format",
    "absl_strings",
    "absl_synchronization",
    "absl_time",
]

def sluice_system_libraries():
    """Declares every system library repository; called from WORKSPACE."""
    pkg_config_library(
        name = "system_absl",
        modules = _ABSL_MODULES,
        debian_package = "libabsl-dev",
    )
    pkg_config_library(
        name = "system_protobuf",
        modules = ["protobuf"],
        debian_package = "libprotobuf-dev",
    )
    pkg_config_library(
        name = "system_grpc",
        modules = ["grpc++"],
        debian_package = "libgrpc++-dev",
    )
    pkg_config_library(
        name = "system_ucx",
        modules = ["ucx"],
        debian_package = "libucx-dev",
        check_headers = ["ucp/api/ucp.h"],
    )
    pkg_config_library(
        name = "system_prometheus",
        modules = ["prometheus-cpp-core", "prometheus-cpp-pull"],
        debian_package = "prometheus-cpp-dev",
    )
    pkg_config_library(
        name = "system_httplib",
        modules = ["cpp-httplib"],
        debian_package = "libcpp-httplib-dev",
        check_headers = ["httplib.h"],
    )
    # Header-only: Boost.Beast's HTTP/1.1 on Boost.Asio (no pkg-config module).
    pkg_config_library(
        name = "system_beast",
        modules = [],
        debian_package = "libboost-dev",
        check_headers = ["boost/beast/http.hpp", "boost/asio/ip/tcp.hpp"],
        extra_linkopts = ["-lpthread"],
    )
    pkg_config_library(
        name = "system_json",
        modules = ["nlohmann_json"],
        debian_package = "nlohmann-json3-dev",
        check_headers = ["nlohmann/json.hpp"],
    )
    pkg_config_library(
        name = "system_openblas",
        modules = ["openblas"],
        debian_package = "libopenblas-dev",
    )
    pkg_config_library(
        name = "system_glog",
        modules = ["libglog"],
        debian_package = "libgoogle-glog-dev",
    )
    pkg_config_library(
        name = "system_gtest",
        modules = ["gtest"],
        debian_package = "libgtest-dev",
    )
    pkg_config_library(
        name = "system_gmock",
        modules = ["gmock"],
        debian_package = "libgmock-dev",
    )
    pkg_config_library(
        name = "system_gtest_main",
        modules = ["gtest_main"],
        debian_package = "libgtest-dev",
    )
    pkg_config_library(
        name = "system_benchmark",
        modules = ["benchmark"],
        debian_package = "libbenchmark-dev",
        extra_linkopts = ["-lpthread"],
    )
    pkg_config_library(
        name = "system_icu",
        modules = ["icu-uc"],
        debian_package = "libicu-dev",
        check_headers = ["unicode/uchar.h"],
    )
    local_cuda(name = "local_cuda")
