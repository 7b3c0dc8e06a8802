#include "daemon/coordinator/job_store.h"

#include "daemon/coordinator/sqlite_job_store.h"

namespace cohort::coordinator {

StatusOr<std::unique_ptr<JobStore>> JobStore::open(const std::string& data_dir) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<SqliteJobStore> store, SqliteJobStore::open(data_dir));
  return std::unique_ptr<JobStore>(std::move(store));
}

}  // namespace cohort::coordinator
