"""`cc_grpc_library`: C++ message and gRPC service code from .proto files, with Debian's
protoc and grpc_cpp_plugin (Bazel's native proto rules would need protobuf's sources).

    cc_grpc_library(name = "decode_cc_grpc", srcs = ["decode.proto"], deps = [":common_cc_grpc"])

Generated headers are included by their path in the workspace: "proto/decode.pb.h" and
"proto/decode.grpc.pb.h". Protos import one another by workspace path too.
"""

def cc_grpc_library(name, srcs, deps = [], grpc = True, visibility = None):
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    pkg = native.package_name()
    proto_paths = " ".join([(pkg + "/" if pkg else "") + s for s in srcs])
    dep_protos = [d + "_protos" for d in deps]
    cmd = "/usr/bin/protoc -I. -I$(GENDIR) --cpp_out=$(GENDIR) "
    if grpc:
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin "
    cmd += proto_paths
    native.filegroup(
        name = name + "_protos",
        srcs = srcs + dep_protos,
        visibility = visibility,
    )
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_protos,
        outs = outs,
        cmd = cmd,
        message = "protoc " + proto_paths,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )
