#pragma once

// ProtoFileClient: calls a gRPC method whose messages are read at run time from a .proto file of
// Debian's grpc-proto package (/usr/share/grpc-proto), the way grpcurl does with -proto. Tests use
// it for grpc.health.v1 and grpc.reflection.v1alpha: libgrpc++_reflection already registers its
// own compiled reflection.proto in protobuf's generated pool, so compiling the file into a test
// that links the daemon would register it twice (a fatal error); a private DescriptorPool does not.
//
//   ProtoFileClient reflection("grpc/reflection/v1alpha/reflection.proto");
//   auto request = reflection.message("grpc.reflection.v1alpha.ServerReflectionRequest");
//   ...set fields through request->GetReflection()...
//   ProtoFileClient::Reply reply = reflection.call(channel, "/grpc.reflection.v1alpha.ServerReflection/"
//       "ServerReflectionInfo", *request, "grpc.reflection.v1alpha.ServerReflectionResponse");
//
// Every call has a deadline (kCallTimeout). Not thread-safe; one per thread.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/compiler/importer.h>
#include <google/protobuf/dynamic_message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

namespace cohort::daemon::testing {

// Where Debian's grpc-proto package puts gRPC's own service definitions.
inline constexpr const char* kGrpcProtoDir = "/usr/share/grpc-proto";

class ProtoFileClient {
 public:
  static constexpr std::chrono::seconds kCallTimeout{20};

  struct Reply {
    grpc::Status status;
    std::unique_ptr<google::protobuf::Message> message;  // null unless status is OK and it parsed
  };

  // Parses `proto_file` (relative to kGrpcProtoDir); a parse error fails the test.
  explicit ProtoFileClient(const std::string& proto_file) : importer_(&tree_, &errors_) {
    tree_.MapPath("", kGrpcProtoDir);
    file_ = importer_.Import(proto_file);
    EXPECT_NE(file_, nullptr) << "cannot parse " << kGrpcProtoDir << "/" << proto_file << errors_.text
                              << " (is grpc-proto installed? deploy/install-deps.sh)";
  }

  // An empty message of `type` (a full name from the file); null and a test failure if unknown.
  std::unique_ptr<google::protobuf::Message> message(const std::string& type) {
    const google::protobuf::Descriptor* descriptor = importer_.pool()->FindMessageTypeByName(type);
    EXPECT_NE(descriptor, nullptr) << type << " is not in the parsed file";
    if (descriptor == nullptr) return nullptr;
    return std::unique_ptr<google::protobuf::Message>(factory_.GetPrototype(descriptor)->New());
  }

  // Sends `request` on `method` ("/package.Service/Method"), half-closes and reads one reply of
  // `response_type`. Works for unary and streaming methods alike (on the wire a unary call is a
  // stream of one message each way).
  Reply call(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
             const google::protobuf::Message& request, const std::string& response_type) {
    Reply reply;
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    grpc::CompletionQueue queue;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream = stub.PrepareCall(&context, method, &queue);
    const std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer out(&slice, 1);
    grpc::ByteBuffer in;
    stream->StartCall(tag(1));
    bool ok = next(queue, 1);
    if (ok) {
      stream->Write(out, tag(2));
      ok = next(queue, 2);
    }
    if (ok) {
      stream->WritesDone(tag(3));
      ok = next(queue, 3);
    }
    bool got = false;
    if (ok) {
      stream->Read(&in, tag(4));
      got = next(queue, 4);
    }
    stream->Finish(&reply.status, tag(5));
    next(queue, 5);
    queue.Shutdown();
    void* ignored_tag = nullptr;
    bool ignored_ok = false;
    while (queue.Next(&ignored_tag, &ignored_ok)) {
    }
    if (!reply.status.ok() || !got) return reply;
    std::vector<grpc::Slice> slices;
    std::string received;
    if (in.Dump(&slices).ok()) {
      for (const grpc::Slice& part : slices) received.append(reinterpret_cast<const char*>(part.begin()), part.size());
    }
    std::unique_ptr<google::protobuf::Message> response = message(response_type);
    if (response != nullptr && response->ParseFromString(received)) reply.message = std::move(response);
    EXPECT_NE(reply.message, nullptr) << method << " answered bytes that are not a " << response_type;
    return reply;
  }

 private:
  class Errors : public google::protobuf::compiler::MultiFileErrorCollector {
   public:
    void AddError(const std::string& file, int line, int column, const std::string& message) override {
      text += "\n" + file + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
    }
    std::string text;
  };

  static void* tag(intptr_t n) { return reinterpret_cast<void*>(n); }
  // Waits for the operation tagged `n`; whether it succeeded.
  static bool next(grpc::CompletionQueue& queue, intptr_t n) {
    void* got = nullptr;
    bool ok = false;
    if (!queue.Next(&got, &ok)) return false;
    EXPECT_EQ(got, tag(n));
    return ok;
  }

  google::protobuf::compiler::DiskSourceTree tree_;
  Errors errors_;
  google::protobuf::compiler::Importer importer_;
  google::protobuf::DynamicMessageFactory factory_;
  const google::protobuf::FileDescriptor* file_ = nullptr;
};

}  // namespace cohort::daemon::testing
