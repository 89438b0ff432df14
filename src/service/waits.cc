#include "service/waits.h"

#include <sys/stat.h>

#include "common/time.h"

namespace dyad {

uint64_t WaitRegistry::Add(Wait w) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_id_++;
  Entry e;
  e.w = std::move(w);
  e.start_ns = MonoNs();
  waits_.emplace(id, std::move(e));
  return id;
}

void WaitRegistry::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  waits_.erase(id);
}

size_t WaitRegistry::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return waits_.size();
}

std::string WaitRegistry::LocalFile(const std::string& cons_path, const std::string& upath) const {
  if (upath.empty() || upath[0] == '/' || upath == ".." || upath.compare(0, 3, "../") == 0 ||
      upath.find("/../") != std::string::npos)
    return "";
  std::vector<std::string> dirs;
  if (!cons_path.empty()) dirs.push_back(cons_path);
  dirs.insert(dirs.end(), dirs_.begin(), dirs_.end());
  for (const std::string& d : dirs) {
    if (d.empty()) continue;
    const std::string path = d + "/" + upath;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return path;
  }
  return "";
}

WaitInfo WaitRegistry::InfoOf(const Entry& e, uint64_t now) const {
  WaitInfo i;
  i.kind = e.w.kind;
  i.ns = e.w.ns;
  i.upath = e.w.upath;
  i.pid = e.w.pid;
  i.age_ns = now > e.start_ns ? now - e.start_ns : 0;
  return i;
}

std::vector<WaitInfo> WaitRegistry::Snapshot() const { return Collect(0, false); }

std::vector<WaitInfo> WaitRegistry::LongWaits(uint64_t min_age_ns) {
  return Collect(min_age_ns, true);
}

std::vector<WaitInfo> WaitRegistry::Collect(uint64_t min_age_ns, bool once) const {
  std::vector<WaitInfo> out;
  std::vector<std::string> cons;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t now = MonoNs();
    for (const auto& [id, e] : waits_) {
      if ((once && e.reported) || now - e.start_ns < min_age_ns) continue;
      e.reported = e.reported || once;
      out.push_back(InfoOf(e, now));
      cons.push_back(e.w.kind == "consume" ? e.w.cons_path : std::string());
    }
  }
  // Outside the lock: stat() may be slow on a busy file system.
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k].kind == "consume") out[k].local = LocalFile(cons[k], out[k].upath);
  return out;
}

}  // namespace dyad
