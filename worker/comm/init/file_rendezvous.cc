#include "worker/comm/init/file_rendezvous.h"

#include <charconv>
#include <chrono>
#include <string_view>

#include <fmt/format.h>

#include "worker/comm/store/prefix_store.h"

namespace cohort::comm {
namespace {

// Keys of the join protocol, under "cohort/file_init/<group>/" in the file.
constexpr const char* kKeyRoot = "cohort/file_init";
constexpr const char* kDefaultGroup = "default";

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool parse_int64(std::string_view text, int64_t* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

class Joiner {
 public:
  Joiner(std::shared_ptr<Store> file, const FileRendezvousOptions& options)
      : file_(std::move(file)),
        options_(options),
        group_(options.group_name.empty() ? kDefaultGroup : options.group_name),
        root_(fmt::format("{}/{}", kKeyRoot, group_)),
        now_ms_(options.now_ms ? options.now_ms : system_now_ms) {}

  StatusOr<FileRendezvous> join() {
    for (int attempt = 0; attempt < kMaxFileJoinAttempts; ++attempt) {
      COHORT_ASSIGN_OR_RETURN(int64_t generation, current_generation());
      COHORT_ASSIGN_OR_RETURN(bool joined, try_join(generation));
      if (joined) return result_;
    }
    return aborted_error(
        "file:// init {}: the group {:?} moved to a new generation {} times while this process joined "
        "(many jobs starting on one file at once?); use a separate path or group_name per job",
        options_.path, group_, kMaxFileJoinAttempts);
  }

 private:
  std::string key(int64_t generation, std::string_view name) const {
    return fmt::format("{}/g{}/{}", root_, generation, name);
  }

  StatusOr<int64_t> read_int(const std::string& key, const std::string& text) const {
    int64_t value = 0;
    if (!parse_int64(text, &value)) {
      return data_loss_error(
          "file:// init {}: key {:?} holds {:?}, not a number; the file is not a cohort file:// store (or "
          "is damaged): delete it or use a fresh path",
          options_.path, key, text);
    }
    return value;
  }

  // Creates the counter at 0 if missing; returns the current generation.
  StatusOr<int64_t> current_generation() {
    const std::string generation_key = root_ + "/generation";
    COHORT_ASSIGN_OR_RETURN(std::string text, file_->compare_set(generation_key, "", "0"));
    return read_int(generation_key, text);
  }

  // Moves the group past `generation` (a no-op when another process already did).
  Status retire(int64_t generation) {
    return file_
        ->compare_set(root_ + "/generation", std::to_string(generation), std::to_string(generation + 1))
        .status();
  }

  // One attempt on `generation`: true when this process joined it (result_ set), false when the
  // generation belongs to an earlier job and was retired.
  StatusOr<bool> try_join(int64_t generation) {
    // 2. A generation opened longer ago than the join window is dead.
    const int64_t now = now_ms_();
    const std::string opened_key = key(generation, "opened_ms");
    COHORT_ASSIGN_OR_RETURN(std::string opened_text, file_->compare_set(opened_key, "", std::to_string(now)));
    COHORT_ASSIGN_OR_RETURN(int64_t opened, read_int(opened_key, opened_text));
    const int64_t window_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.join_window).count();
    if (now - opened > window_ms) {
      COHORT_RETURN_IF_ERROR(retire(generation));
      return false;
    }
    // 3. The generation's world size, then a slot.
    const std::string size_key = key(generation, "world_size");
    COHORT_ASSIGN_OR_RETURN(std::string size_text,
                            file_->compare_set(size_key, "", std::to_string(options_.world_size)));
    COHORT_ASSIGN_OR_RETURN(int64_t world_size, read_int(size_key, size_text));
    const std::string joined_key = key(generation, "joined");
    if (world_size != options_.world_size) {
      COHORT_ASSIGN_OR_RETURN(int64_t joined, file_->add(joined_key, 0));
      if (joined >= world_size) {
        COHORT_RETURN_IF_ERROR(retire(generation));
        return false;
      }
      return invalid_argument_error(
          "file:// init {} (group {:?}): this process says world size {}, but the {} process(es) that joined "
          "generation {} less than {} s ago said {}; give every rank the same world_size, or, if those "
          "belong to another or a crashed job, delete the file or use a fresh path or group_name",
          options_.path, group_, options_.world_size, joined, generation, window_ms / 1000, world_size);
    }
    COHORT_ASSIGN_OR_RETURN(int64_t slot, file_->add(joined_key, 1));
    if (slot > world_size) {
      // Full: an earlier job (finished, or crashed after all its ranks joined) holds it.
      COHORT_RETURN_IF_ERROR(retire(generation));
      return false;
    }
    // 4. The rank.
    int rank = options_.rank;
    if (rank < 0) {
      rank = static_cast<int>(slot - 1);
    } else {
      const std::string claim = fmt::format("slot {}", slot);
      const std::string rank_key = key(generation, fmt::format("rank/{}", rank));
      COHORT_ASSIGN_OR_RETURN(std::string holder, file_->compare_set(rank_key, "", claim));
      if (holder != claim) {
        return invalid_argument_error(
            "file:// init {} (group {:?}): rank {} already joined generation {} of this file less than {} s "
            "ago; two processes were given rank {}, or a job that crashed before all its ranks joined left "
            "the file: delete the file or use a fresh path or group_name",
            options_.path, group_, rank, generation, window_ms / 1000, rank);
      }
    }
    result_.store = std::make_shared<PrefixStore>(fmt::format("{}/g{}/job", root_, generation), file_);
    result_.rank = rank;
    result_.generation = static_cast<int>(generation);
    return true;
  }

  const std::shared_ptr<Store> file_;
  const FileRendezvousOptions& options_;
  const std::string group_;
  const std::string root_;
  const std::function<int64_t()> now_ms_;
  FileRendezvous result_;
};

}  // namespace

Status check_group_name(const std::string& group_name) {
  bool valid = !group_name.empty() && group_name.size() <= kMaxFileGroupNameBytes;
  for (char c : group_name) {
    bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                   c == '-' || c == '.';
    valid = valid && allowed;
  }
  if (valid) return ok_status();
  return invalid_argument_error(
      "group_name {:?} is not 1..{} characters of letters, digits, '_', '-' and '.'", group_name,
      kMaxFileGroupNameBytes);
}

StatusOr<FileRendezvous> join_file_rendezvous(const std::shared_ptr<Store>& file,
                                              const FileRendezvousOptions& options) {
  if (options.world_size < 1) {
    return invalid_argument_error(
        "file:// init {}: the world size is not set; add ?world_size=N to the URL or set "
        "InitOptions::world_size (a file:// store assigns missing ranks, but needs the job's size)",
        options.path);
  }
  if (options.rank >= options.world_size) {
    return invalid_argument_error("file:// init {}: rank {} is out of range for world size {}", options.path,
                                  options.rank, options.world_size);
  }
  if (!options.group_name.empty()) COHORT_RETURN_IF_ERROR(check_group_name(options.group_name));
  return Joiner(file, options).join();
}

}  // namespace cohort::comm
