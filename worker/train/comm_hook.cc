#include "worker/train/comm_hook.h"

#include <string>

#include <ATen/core/grad_mode.h>

#include "worker/distributed/collectives.h"

namespace cohort::train {

namespace {

distributed::OpOptions async_options(const GradBucket& bucket) {
  distributed::OpOptions options;
  options.async_op = true;
  options.timeout = bucket.timeout;
  return options;
}

// Casts the bucket to `type` (÷ world size), allreduces SUM, casts back into bucket.buffer.
BucketFuture compress_hook(comm::Communicator& group, const GradBucket& bucket, at::ScalarType type,
                           const char* name) {
  at::NoGradGuard no_grad;
  at::Tensor compressed = bucket.buffer.to(type).div_(group.size());
  auto reduced = distributed::all_reduce(group, compressed, comm::ReduceOp::kSum, async_options(bucket));
  at::Tensor buffer = bucket.buffer;
  auto decompressed = distributed::then(reduced, name, [compressed, buffer](const Status& transfers) {
    if (transfers.ok()) {
      at::NoGradGuard guard;
      buffer.copy_(compressed);
    }
    return transfers;
  });
  return {decompressed, buffer};
}

}  // namespace

BucketFuture allreduce_hook(comm::Communicator& group, const GradBucket& bucket) {
  at::NoGradGuard no_grad;
  bucket.buffer.div_(group.size());
  return {distributed::all_reduce(group, bucket.buffer, comm::ReduceOp::kSum, async_options(bucket)),
          bucket.buffer};
}

BucketFuture fp16_compress_hook(comm::Communicator& group, const GradBucket& bucket) {
  return compress_hook(group, bucket, at::kHalf, "fp16_compress_hook");
}

BucketFuture bf16_compress_hook(comm::Communicator& group, const GradBucket& bucket) {
  return compress_hook(group, bucket, at::kBFloat16, "bf16_compress_hook");
}

}  // namespace cohort::train
