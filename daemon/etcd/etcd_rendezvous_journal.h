#pragma once

// EtcdRendezvousJournal: one placed attempt's rendezvous journal in etcd (issue 16), so a
// coordinator taking over continues the rendezvous where its predecessor left it
// (daemon/coordinator/rendezvous_journal.h says what is written and why). EtcdJobStore makes one per
// attempt (rendezvous_journal) and reads it back (load_rendezvous). Keys, under the attempt's
// prefix <prefix>/rendezvous/<job id>/<attempt, 10 digits>/:
//
//   progress            StoredRendezvousProgress (job_records.proto): joined ranks once complete,
//                       barrier generation, left ranks
//   kv/<store key>      the store key's value, raw bytes
//   req/<request id>    the answer of an add / delete sent with a request id
//
// Lifetime: the save that places the attempt (EtcdJobStore::save, PENDING -> PLACED) writes an
// empty progress record in the same transaction (open_op; a coordinator recovering an attempt
// placed without one writes it then, EtcdJobStore::open_rendezvous_journal); the save that moves
// the job out of PLACED / RUNNING deletes the job's whole rendezvous prefix in its transaction, and
// so does delete_job. Every journal write compares that the progress record still exists, so a
// write still in flight when the attempt ends (the rendezvous closes only once it returns) is
// refused (FAILED_PRECONDITION, "has ended") instead of recreating keys under a prefix nothing reads.
//
// Cost: every write is one etcd Txn (the progress record; or a store key with its request's answer
// and the evicted answers' deletions), fenced on the leader's election key like every job store
// write and on the attempt's progress record: a deposed leader's write, or one for an ended
// attempt, is refused and changes nothing. No reads (a refused write reads the progress record back
// in the same Txn, to say which comparison failed).
//
// Thread-safe (EtcdClient is; the rest is immutable). Blocks on one etcd round trip per write,
// bounded by the client's call timeout.

#include <optional>
#include <string>
#include <vector>

#include "daemon/coordinator/rendezvous_journal.h"
#include "daemon/etcd/etcd_client.h"
#include "worker/base/status.h"

namespace cohort::etcd {

class EtcdRendezvousJournal final : public coordinator::RendezvousJournal {
 public:
  // The journal under `attempt_prefix` (ending in '/'); `client` must outlive it; writes are fenced
  // on `fence` when set. `what` names the attempt in errors ("job mnist-3 attempt 1").
  EtcdRendezvousJournal(EtcdClient* client, std::string attempt_prefix, std::optional<LeaderKey> fence,
                        std::string what);

  Status write_progress(const coordinator::RendezvousProgress& progress) override;
  Status write_key(const std::string& key, const std::optional<std::string>& value,
                   const coordinator::AnsweredRequest& answered,
                   const std::vector<std::string>& forget) override;

  // The operation that opens the journal under `attempt_prefix` (an empty progress record), for the
  // transaction that places the attempt. Without it every write of the journal is refused.
  static etcdserverpb::RequestOp open_op(const std::string& attempt_prefix);
  // The progress record's key: the journal is open while it exists.
  static std::string progress_key(const std::string& attempt_prefix);

  // Decodes the keys read under `attempt_prefix` (any order) into the state they hold; answered
  // requests oldest first (by etcd revision). DATA_LOSS for a record that is not one.
  static StatusOr<coordinator::RendezvousState> decode(const std::string& attempt_prefix,
                                                       const std::vector<KeyValue>& kvs);

 private:
  // Runs `request` behind the fence, if the attempt's progress record exists. FAILED_PRECONDITION
  // when either comparison fails, saying which.
  Status write(etcdserverpb::TxnRequest request, const std::string& what);

  EtcdClient* const client_;
  const std::string prefix_;
  const std::optional<LeaderKey> fence_;
  const std::string what_;
};

}  // namespace cohort::etcd
