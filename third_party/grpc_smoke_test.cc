// Protobuf and gRPC link and run: a message round trip through bytes, and a real unary call to
// an in-process server listening on a loopback port.
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "third_party/smoke.grpc.pb.h"
#include "third_party/smoke.pb.h"

namespace {

TEST(ProtobufSmoke, RoundTrip) {
  sluice::smoke::EchoRequest req;
  req.set_text("héllo");
  req.add_tokens(7);
  req.add_tokens(-3);
  std::string bytes;
  ASSERT_TRUE(req.SerializeToString(&bytes));
  sluice::smoke::EchoRequest back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  EXPECT_EQ(back.text(), "héllo");
  ASSERT_EQ(back.tokens_size(), 2);
  EXPECT_EQ(back.tokens(1), -3);
  EXPECT_FALSE(back.ParseFromString(std::string("\xff\xff\xff", 3)));
}

class EchoService final : public sluice::smoke::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const sluice::smoke::EchoRequest* req,
                    sluice::smoke::EchoReply* reply) override {
    int sum = 0;
    for (int t : req->tokens()) sum += t;
    reply->set_text(req->text());
    reply->set_token_sum(sum);
    return grpc::Status::OK;
  }
};

TEST(GrpcSmoke, UnaryCallOverLoopback) {
  EchoService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = sluice::smoke::Echo::NewStub(channel);
  sluice::smoke::EchoRequest req;
  req.set_text("ping");
  for (int i = 1; i <= 4; ++i) req.add_tokens(i);
  sluice::smoke::EchoReply reply;
  grpc::ClientContext ctx;
  grpc::Status status = stub->Echo(&ctx, req, &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.text(), "ping");
  EXPECT_EQ(reply.token_sum(), 10);
  server->Shutdown();
}

}  // namespace
