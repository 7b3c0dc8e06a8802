#include "worker/train/multi_node_checkpointer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize/archive.h>

namespace cohort::train {

namespace fs = std::filesystem;

// One registered section: how to write it into, and read it from, a nested archive.
struct MultiNodeCheckpointer::Entry {
  std::string key;
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

namespace {

constexpr char kIterationKey[] = "iteration";

Status write_all(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("write(" + path + ")", errno);
    }
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

// Writes `data` to `path` so that a crash leaves the old file or the new one: temp file, fsync,
// rename, fsync of the directory (which makes the rename durable).
Status write_atomically(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("open(" + tmp + ")", errno);
  Status status = write_all(fd, data, tmp);
  if (status.ok() && ::fsync(fd) != 0) status = errno_status("fsync(" + tmp + ")", errno);
  if (::close(fd) != 0 && status.ok()) status = errno_status("close(" + tmp + ")", errno);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = errno_status("rename(" + tmp + ", " + path + ")", errno);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  std::string dir = fs::path(path).parent_path().string();
  int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return errno_status("open(" + dir + ")", errno);
  if (::fsync(dir_fd) != 0) status = errno_status("fsync(" + dir + ")", errno);
  ::close(dir_fd);
  return status;
}

// True when every parameter and buffer of `module` (and its submodules) is on the CPU (or undefined).
bool all_on_cpu(const torch::nn::Module& module) {
  for (const at::Tensor& t : module.parameters()) {
    if (t.defined() && !t.is_cpu()) return false;
  }
  for (const at::Tensor& t : module.buffers()) {
    if (t.defined() && !t.is_cpu()) return false;
  }
  return true;
}

// `t` itself when it is on the CPU; else a host copy (a leaf, with t's requires_grad), so files
// written from a GPU run hold host tensors and load into a model on any device.
at::Tensor host_tensor(const at::Tensor& t) {
  if (!t.defined() || t.is_cpu()) return t;
  at::Tensor copy = t.detach().cpu();
  if (t.requires_grad()) copy.requires_grad_(true);
  return copy;
}

// Module::save's layout (parameters, buffers, then one nested archive per serializable child)
// with host copies of device tensors.
void save_module_on_host(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    archive.write(item.key(), host_tensor(item.value()));
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    archive.write(item.key(), host_tensor(item.value()), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    save_module_on_host(*child.value(), child_archive);
    archive.write(child.key(), child_archive);
  }
}

// Module::load's counterpart of save_module_on_host: every value lands on the device of the
// registered tensor it replaces (Module::load would move the tensor to the file's device).
void load_module_onto_devices(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  torch::NoGradGuard no_grad;
  auto read_into = [&archive](const std::string& key, at::Tensor& target, bool is_buffer) {
    if (!target.defined() || target.is_cpu()) {
      archive.read(key, target, is_buffer);
      return;
    }
    at::Tensor value;
    archive.read(key, value, is_buffer);
    target.set_(value.to(target.device()));
  };
  for (auto& item : module.named_parameters(/*recurse=*/false)) read_into(item.key(), item.value(), false);
  for (auto& item : module.named_buffers(/*recurse=*/false)) read_into(item.key(), item.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    load_module_onto_devices(*child.value(), child_archive);
  }
}

// A model entirely on the CPU goes through the module's own save/load; one with tensors on a
// GPU is written as host tensors and loaded back onto its tensors' devices.
void save_module(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  if (all_on_cpu(module)) {
    module.save(archive);
  } else {
    save_module_on_host(module, archive);
  }
}

void load_module(torch::nn::Module& module, torch::serialize::InputArchive& archive) {
  if (all_on_cpu(module)) {
    module.load(archive);
  } else {
    load_module_onto_devices(module, archive);
  }
}

std::string join(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

std::vector<int64_t> split(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoll(item));
  }
  return out;
}

bool all_digits(const std::string& text) {
  return !text.empty() && text.size() <= 18 && std::all_of(text.begin(), text.end(), ::isdigit);
}

// <name>.iter<iteration>.rank<rank>of<size>.pt, parsed; nullopt for any other file.
std::optional<CheckpointFile> parse_file_name(const std::string& file, const std::string& name) {
  const std::string prefix = name + ".iter", suffix = ".pt";
  if (file.size() <= prefix.size() + suffix.size() || file.compare(0, prefix.size(), prefix) != 0 ||
      file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string middle = file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
  const size_t rank_at = middle.find(".rank");
  const size_t of_at = rank_at == std::string::npos ? std::string::npos : middle.find("of", rank_at);
  if (of_at == std::string::npos) return std::nullopt;
  const std::string iteration = middle.substr(0, rank_at);
  const std::string rank = middle.substr(rank_at + 5, of_at - rank_at - 5);
  const std::string size = middle.substr(of_at + 2);
  if (!all_digits(iteration) || !all_digits(rank) || !all_digits(size) || size.size() > 9)
    return std::nullopt;
  CheckpointFile out{std::stoll(iteration), static_cast<int>(std::stoll(rank)),
                     static_cast<int>(std::stoll(size))};
  if (out.rank >= out.size) return std::nullopt;
  return out;
}

// The checkpoints of world sizes other than `size` among `files`, for resume()'s allgather:
// "<iteration>:<size>" for a set this rank sees whole (a shared directory), else
// "<iteration>:<size>:<rank>.<rank>..." with the ranks whose files it sees (node-local
// directories: the ranks' reports together may make the set whole), ";"-separated.
std::string describe_other_sizes(const std::vector<CheckpointFile>& files, int size) {
  std::map<std::pair<int64_t, int>, std::set<int>> sets;
  for (const CheckpointFile& f : files) {
    if (f.size != size) sets[{f.iteration, f.size}].insert(f.rank);
  }
  std::string out;
  for (const auto& [key, ranks] : sets) {
    out += fmt::format("{}{}:{}", out.empty() ? "" : ";", key.first, key.second);
    if (static_cast<int>(ranks.size()) == key.second) continue;
    std::string listed;
    for (int r : ranks) listed += (listed.empty() ? "" : ".") + std::to_string(r);
    out += ":" + listed;
  }
  return out;
}

// The other sizes' sets that are whole over all ranks' reports (describe_other_sizes), newest
// iteration first.
std::vector<std::pair<int64_t, int>> whole_other_size_sets(const std::vector<std::string>& reports) {
  std::map<std::pair<int64_t, int>, std::set<int>> seen;
  std::set<std::pair<int64_t, int>> whole;
  for (const std::string& report : reports) {
    std::stringstream in(report);
    std::string item;
    while (std::getline(in, item, ';')) {
      std::vector<std::string> parts;
      std::stringstream fields(item);
      for (std::string part; std::getline(fields, part, ':');) parts.push_back(part);
      if (parts.size() < 2) continue;
      std::pair<int64_t, int> key{std::stoll(parts[0]), static_cast<int>(std::stoll(parts[1]))};
      if (parts.size() == 2) {
        whole.insert(key);
        continue;
      }
      std::stringstream ranks(parts[2]);
      for (std::string r; std::getline(ranks, r, '.');) seen[key].insert(static_cast<int>(std::stoll(r)));
      if (static_cast<int>(seen[key].size()) == key.second) whole.insert(key);
    }
  }
  return std::vector<std::pair<int64_t, int>>(whole.rbegin(), whole.rend());
}

// Every (iteration, world size) that any of the ranks' reports (describe_other_sizes) names, whole
// or not: for check_fresh_start, where any file of another run counts.
std::set<std::pair<int64_t, int>> all_sets(const std::vector<std::string>& reports) {
  std::set<std::pair<int64_t, int>> out;
  for (const std::string& report : reports) {
    std::stringstream in(report);
    std::string item;
    while (std::getline(in, item, ';')) {
      std::stringstream fields(item);
      std::string iteration, size;
      if (!std::getline(fields, iteration, ':') || !std::getline(fields, size, ':')) continue;
      out.insert({std::stoll(iteration), static_cast<int>(std::stoll(size))});
    }
  }
  return out;
}

// "iterations 40, 50 saved by 2 ranks; iteration 30 saved by 1 rank", the newest few per size.
std::string describe_sets(const std::set<std::pair<int64_t, int>>& sets) {
  constexpr size_t kListed = 5;
  std::map<int, std::vector<int64_t>> by_size;
  for (const auto& [iteration, size] : sets) by_size[size].push_back(iteration);
  std::string out;
  for (const auto& [size, iterations] : by_size) {
    const size_t first = iterations.size() > kListed ? iterations.size() - kListed : 0;
    std::string listed;
    for (size_t i = first; i < iterations.size(); ++i)
      listed += (listed.empty() ? "" : ", ") + std::to_string(iterations[i]);
    const std::string older = first > 0 ? fmt::format("(and {} older) ", first) : "";
    out += fmt::format("{}iteration{} {}{} saved by {} rank{}", out.empty() ? "" : "; ",
                       iterations.size() > 1 ? "s" : "", older, listed, size, size > 1 ? "s" : "");
  }
  return out;
}

}  // namespace

MultiNodeCheckpointer::MultiNodeCheckpointer(std::string name, comm::Communicator& comm,
                                             std::string directory, CheckpointerOptions options)
    : name_(std::move(name)), comm_(comm), directory_(std::move(directory)), options_(options) {
  options_.keep_generations = std::max(options_.keep_generations, 1);
}

MultiNodeCheckpointer::~MultiNodeCheckpointer() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

std::string MultiNodeCheckpointer::lock_path() const {
  return fmt::format("{}/{}.rank{}of{}.lock", directory_, name_, comm_.rank(), comm_.size());
}

Status MultiNodeCheckpointer::lock_directory() {
  if (lock_fd_ >= 0) return ok_status();
  const std::string path = lock_path();
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno_status("open(" + path + ")", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[128] = {0};
    ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (error != EWOULDBLOCK) return errno_status("flock(" + path + ")", error);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("another process");
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    return failed_precondition_error(
        "checkpointer {}: checkpoint directory {} is in use: {} holds {} (another attempt of this job, or "
        "another job, still writes it). Two writers would corrupt its checkpoints; stop the other one, or "
        "give this run its own checkpoint.dir",
        name_, directory_, who, path);
  }
  // Who holds it, for the error the next one gets.
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  const char* attempt = std::getenv("COHORT_ATTEMPT");
  const std::string holder = fmt::format("pid {} on {}{}\n", ::getpid(), host,
                                         attempt != nullptr ? fmt::format(" (attempt {})", attempt) : "");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, holder.data(), holder.size(), 0) < 0) {
    // Only the message suffers; the lock is held.
  }
  lock_fd_ = fd;
  return ok_status();
}

void MultiNodeCheckpointer::add_module(const std::string& key, torch::nn::Module& module) {
  entries_.push_back(std::make_shared<Entry>(
      Entry{"module." + key, [&module](auto& archive) { save_module(module, archive); },
            [&module](auto& archive) { load_module(module, archive); }}));
}

void MultiNodeCheckpointer::add_optimizer(const std::string& key, torch::optim::Optimizer& optimizer) {
  entries_.push_back(std::make_shared<Entry>(
      Entry{"optimizer." + key, [&optimizer](auto& archive) { optimizer.save(archive); },
            [&optimizer](auto& archive) { optimizer.load(archive); }}));
}

void MultiNodeCheckpointer::add_tensors(const std::string& key, std::vector<at::Tensor> tensors) {
  auto shared = std::make_shared<std::vector<at::Tensor>>(std::move(tensors));
  entries_.push_back(std::make_shared<Entry>(
      Entry{"tensors." + key,
            [shared](torch::serialize::OutputArchive& archive) {
              for (size_t i = 0; i < shared->size(); ++i)
                archive.write(std::to_string(i), (*shared)[i].detach().cpu());
            },
            [shared, key](torch::serialize::InputArchive& archive) {
              torch::NoGradGuard no_grad;
              for (size_t i = 0; i < shared->size(); ++i) {
                at::Tensor value;
                archive.read(std::to_string(i), value);
                at::Tensor& target = (*shared)[i];
                if (value.sizes() != target.sizes()) {
                  std::ostringstream message;
                  message << "tensors." << key << "[" << i << "]: saved shape " << value.sizes()
                          << " but the registered tensor has " << target.sizes();
                  throw std::runtime_error(message.str());
                }
                target.copy_(value);  // onto the registered tensor's device
              }
            }}));
}

void MultiNodeCheckpointer::add_generator(const std::string& key, at::Generator generator) {
  entries_.push_back(
      std::make_shared<Entry>(Entry{"generator." + key,
                                    [generator](torch::serialize::OutputArchive& archive) mutable {
                                      std::lock_guard<std::mutex> lock(generator.mutex());
                                      archive.write("state", generator.get_state());
                                    },
                                    [generator](torch::serialize::InputArchive& archive) mutable {
                                      at::Tensor state;
                                      archive.read("state", state);
                                      std::lock_guard<std::mutex> lock(generator.mutex());
                                      generator.set_state(state);
                                    }}));
}

void MultiNodeCheckpointer::add_iterator(const std::string& key, BatchIterator& iterator) {
  entries_.push_back(std::make_shared<Entry>(
      Entry{"iterator." + key,
            [&iterator](torch::serialize::OutputArchive& archive) {
              IteratorPosition p = iterator.position();
              archive.write("position", at::tensor(std::vector<int64_t>{p.epoch, p.offset}, at::kLong));
              archive.write("seed", c10::IValue(static_cast<int64_t>(iterator.seed())));
            },
            [&iterator](torch::serialize::InputArchive& archive) {
              // The order of an epoch follows from the seed: a position under another seed would
              // silently continue with different samples.
              c10::IValue seed;
              archive.read("seed", seed);
              if (static_cast<uint64_t>(seed.toInt()) != iterator.seed()) {
                throw std::runtime_error("the iterator was saved with shuffle seed " +
                                         std::to_string(static_cast<uint64_t>(seed.toInt())) +
                                         " but now has seed " + std::to_string(iterator.seed()) +
                                         "; resume with the run's original seed");
              }
              at::Tensor p;
              archive.read("position", p);
              iterator.set_position(IteratorPosition{p[0].item<int64_t>(), p[1].item<int64_t>()});
            }}));
}

std::string MultiNodeCheckpointer::path_for(int64_t iteration) const {
  return (fs::path(directory_) /
          fmt::format("{}.iter{:012d}.rank{}of{}.pt", name_, iteration, comm_.rank(), comm_.size()))
      .string();
}

StatusOr<std::string> MultiNodeCheckpointer::serialize(int64_t iteration) const {
  try {
    torch::serialize::OutputArchive archive;
    archive.write(kIterationKey, c10::IValue(iteration));
    for (const auto& entry : entries_) {
      torch::serialize::OutputArchive section;
      entry->save(section);
      archive.write(entry->key, section);
    }
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  } catch (const std::exception& e) {
    return internal_error("checkpointer {}: serializing iteration {}: {}", name_, iteration, e.what());
  }
}

Status MultiNodeCheckpointer::agree(const Status& local, const char* what) {
  COHORT_ASSIGN_OR_RETURN(double failed, comm_.allreduce_obj(local.ok() ? 0.0 : 1.0, comm::ReduceOp::kMax));
  if (!local.ok()) return local;
  if (failed > 0)
    return aborted_error("checkpointer {}: {} failed on another rank of {}", name_, what,
                         comm_.description());
  return ok_status();
}

Status MultiNodeCheckpointer::save(int64_t iteration) {
  Status local = [&]() -> Status {
    if (iteration < 0)
      return invalid_argument_error("checkpointer {}: iteration {} is negative", name_, iteration);
    std::error_code error;
    fs::create_directories(directory_, error);
    if (error)
      return unavailable_error("checkpointer {}: cannot create {}: {}", name_, directory_, error.message());
    COHORT_RETURN_IF_ERROR(lock_directory());
    COHORT_RETURN_IF_ERROR(check_no_newer_run(iteration));
    COHORT_ASSIGN_OR_RETURN(std::string data, serialize(iteration));
    return write_atomically(path_for(iteration), data);
  }();
  COHORT_RETURN_IF_ERROR(agree(local, "save"));
  directory_checked_ = true;
  return collect_garbage(iteration);
}

Status MultiNodeCheckpointer::check_no_newer_run(int64_t iteration) const {
  if (directory_checked_) return ok_status();
  COHORT_ASSIGN_OR_RETURN(std::vector<int64_t> iterations, local_iterations());
  std::vector<int64_t> newer;
  for (int64_t i : iterations) {
    if (i > iteration) newer.push_back(i);
  }
  if (newer.empty()) return ok_status();
  return failed_precondition_error(
      "checkpointer {}: rank {} of {}: {} already holds this checkpoint's iterations {}, newer than the "
      "iteration {} being saved, and resume() was not called: they are another run's. Saving here would mix "
      "the runs (a later resume would load iteration {} of the other run). Call resume() first to continue "
      "that run, or move {}.iter*.pt out of the directory (or use another directory) to start a new one",
      name_, comm_.rank(), comm_.size(), directory_, join(newer), iteration, newer.back(), name_);
}

StatusOr<std::vector<CheckpointFile>> MultiNodeCheckpointer::list_files() const {
  std::vector<CheckpointFile> out;
  std::error_code error;
  if (!fs::exists(directory_, error)) return out;
  for (fs::directory_iterator it(directory_, error), end; !error && it != end; it.increment(error)) {
    if (auto file = parse_file_name(it->path().filename().string(), name_)) out.push_back(*file);
  }
  if (error) return unavailable_error("checkpointer {}: listing {}: {}", name_, directory_, error.message());
  return out;
}

StatusOr<std::vector<int64_t>> MultiNodeCheckpointer::local_iterations() const {
  COHORT_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, list_files());
  return own_iterations(files);
}

std::vector<int64_t> MultiNodeCheckpointer::own_iterations(const std::vector<CheckpointFile>& files) const {
  std::vector<int64_t> out;
  for (const CheckpointFile& f : files) {
    if (f.rank == comm_.rank() && f.size == comm_.size()) out.push_back(f.iteration);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status MultiNodeCheckpointer::collect_garbage(int64_t saved) {
  COHORT_ASSIGN_OR_RETURN(std::vector<int64_t> iterations, local_iterations());
  // Only generations older than the one just saved: it is kept with the newest
  // keep_generations - 1 below it. Newer files (a set that resume() found incomplete on some
  // rank) are left alone; the oldest `size - keep` of the listing could be the file just written.
  std::vector<int64_t> older;
  for (int64_t i : iterations) {
    if (i < saved) older.push_back(i);
  }
  int64_t excess = static_cast<int64_t>(older.size()) - (options_.keep_generations - 1);
  for (int64_t i = 0; i < excess; ++i) {
    std::string path = path_for(older[i]);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_status("unlink(" + path + ")", errno);
  }
  return ok_status();
}

Status MultiNodeCheckpointer::load_file(int64_t iteration) {
  std::string path = path_for(iteration);
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    c10::IValue saved;
    archive.read(kIterationKey, saved);
    if (saved.toInt() != iteration) {
      return data_loss_error("checkpointer {}: {} holds iteration {}, expected {}", name_, path,
                             saved.toInt(), iteration);
    }
    for (const auto& entry : entries_) {
      torch::serialize::InputArchive section;
      archive.read(entry->key, section);
      entry->load(section);
    }
  } catch (const std::exception& e) {
    return data_loss_error("checkpointer {}: loading {}: {}", name_, path, e.what());
  }
  return ok_status();
}

StatusOr<std::optional<int64_t>> MultiNodeCheckpointer::resume() {
  // Reading while another attempt writes could load a set it is replacing: the lock first (when
  // the directory exists; otherwise there is nothing to read and save() takes it).
  std::error_code exists_error;
  Status locked = fs::exists(directory_, exists_error) ? lock_directory() : ok_status();
  COHORT_RETURN_IF_ERROR(agree(locked, "locking the checkpoint directory"));
  StatusOr<std::vector<CheckpointFile>> files = list_files();
  // Each rank's iterations, then "|" and the other world sizes' checkpoints it sees. A rank that
  // cannot list its files contributes "-" so the collective still completes.
  std::vector<int64_t> mine = files.ok() ? own_iterations(files.value()) : std::vector<int64_t>();
  COHORT_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      comm_.allgather_obj(files.ok() ? join(mine) + "|" + describe_other_sizes(files.value(), comm_.size())
                                     : std::string("-")));
  COHORT_RETURN_IF_ERROR(agree(files.status(), "listing checkpoints"));
  std::set<int64_t> common(mine.begin(), mine.end());
  std::vector<std::string> other_sizes;
  for (const auto& report : all) {
    const size_t bar = report.find('|');
    std::vector<int64_t> theirs = split(report.substr(0, bar));
    other_sizes.push_back(bar == std::string::npos ? std::string() : report.substr(bar + 1));
    std::set<int64_t> next;
    for (int64_t i : theirs) {
      if (common.count(i) != 0) next.insert(i);
    }
    common = std::move(next);
  }
  if (common.empty()) {
    // Every rank decides from the same allgathered reports, so all fail (or go on) alike. A
    // checkpoint is per rank (its shard's iterator position, its generators): one saved by
    // another number of ranks cannot be loaded, and starting from scratch beside it would
    // silently drop the run's progress.
    std::vector<std::pair<int64_t, int>> other = whole_other_size_sets(other_sizes);
    if (!other.empty()) {
      return failed_precondition_error(
          "checkpointer {}: {} holds a complete checkpoint of iteration {} saved by {} ranks, but this run "
          "has {} ranks and there is none for {} ranks there; a checkpoint holds each rank's own state and "
          "loads only into as many ranks as saved it. Resume with {} ranks, or, to start from scratch with "
          "{}, move {}.iter*.rank*of{}.pt out of the directory (or use another checkpoint directory)",
          name_, directory_, other[0].first, other[0].second, comm_.size(), comm_.size(), other[0].second,
          comm_.size(), name_, other[0].second);
    }
    directory_checked_ = true;
    return std::optional<int64_t>();
  }
  int64_t iteration = *common.rbegin();
  COHORT_RETURN_IF_ERROR(agree(load_file(iteration), "resume"));
  directory_checked_ = true;
  return std::optional<int64_t>(iteration);
}

Status MultiNodeCheckpointer::check_fresh_start(const std::string& how_to_resume) {
  // As in resume(): another attempt still writing the directory is refused here too.
  std::error_code exists_error;
  Status locked = fs::exists(directory_, exists_error) ? lock_directory() : ok_status();
  COHORT_RETURN_IF_ERROR(agree(locked, "locking the checkpoint directory"));
  // Every file of this name, whatever its size (describe_other_sizes with no size of its own).
  // Node-local directories differ between ranks: what any rank sees counts, and every rank
  // decides from the same allgathered reports, so all fail (or go on) alike. "-": cannot list.
  StatusOr<std::vector<CheckpointFile>> files = list_files();
  COHORT_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      comm_.allgather_obj(files.ok() ? describe_other_sizes(files.value(), 0) : std::string("-")));
  COHORT_RETURN_IF_ERROR(agree(files.status(), "listing checkpoints"));
  const std::set<std::pair<int64_t, int>> sets = all_sets(all);
  if (sets.empty()) return ok_status();
  return failed_precondition_error(
      "checkpointer {}: this run starts from scratch (it does not resume), but the checkpoint directory {} "
      "already holds checkpoints of {}: {}. Saving beside them would mix two runs (a later resume would "
      "load theirs). To continue that run, {}; to start a new one, use another checkpoint directory or "
      "remove {}/{}.iter*.pt",
      name_, directory_, name_, describe_sets(sets), how_to_resume, directory_, name_);
}

StatusOr<int> MultiNodeCheckpointer::start_over() {
  std::error_code exists_error;
  Status locked = fs::exists(directory_, exists_error) ? lock_directory() : ok_status();
  COHORT_RETURN_IF_ERROR(agree(locked, "locking the checkpoint directory"));
  int removed = 0;
  Status local = [&]() -> Status {
    COHORT_ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, list_files());
    for (const CheckpointFile& f : files) {
      const std::string path =
          (fs::path(directory_) / fmt::format("{}.iter{:012d}.rank{}of{}.pt", name_, f.iteration, f.rank, f.size))
              .string();
      // Ranks sharing the directory remove the same files: whoever comes second finds none.
      if (::unlink(path.c_str()) == 0) {
        ++removed;
      } else if (errno != ENOENT) {
        return errno_status("unlink(" + path + ")", errno);
      }
    }
    return ok_status();
  }();
  COHORT_RETURN_IF_ERROR(agree(local, "removing the earlier run's checkpoints"));
  directory_checked_ = true;  // nothing of another run is left to refuse
  return removed;
}

std::unique_ptr<MultiNodeCheckpointer> create_multi_node_checkpointer(const std::string& name,
                                                                      comm::Communicator& comm,
                                                                      const std::string& directory,
                                                                      CheckpointerOptions options) {
  return std::make_unique<MultiNodeCheckpointer>(name, comm, directory, options);
}

}  // namespace cohort::train
