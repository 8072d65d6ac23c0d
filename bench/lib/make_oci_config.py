#!/usr/bin/env python3
"""Rewrite a `runc spec` config.json into the corral-bench container.

The goal is an environment as close as possible to corral's built-in `base`
template and to the bwrap command line used in startup.sh, so that the
startup numbers compare like with like:

  * read-only root; the root itself is an almost empty directory holding the
    merged-usr symlinks, and the host's /usr is bind-mounted read-only on it;
  * /proc, a minimal /dev (tmpfs + pts + shm, the same set `bwrap --dev`
    provides), tmpfs /tmp; no /sys, /dev/mqueue or cgroupfs (bwrap and the
    base template do not mount them either);
  * every namespace: user, pid, mount, network, uts, ipc, cgroup;
  * memory 512M and pids 256 through cgroup v1, in /corral-bench/<name>.

usage: make_oci_config.py CONFIG_JSON CGROUP_NAME [--no-userns]
"""
import json
import sys

MIB = 1024 * 1024


def main() -> None:
    path, cgroup_name = sys.argv[1], sys.argv[2]
    userns = "--no-userns" not in sys.argv[3:]
    with open(path) as f:
        spec = json.load(f)

    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/usr/bin/true"]
    spec["root"] = {"path": "rootfs", "readonly": True}
    spec["hostname"] = "sandbox"

    mounts = []
    for m in spec["mounts"]:
        if m["destination"] in ("/dev/mqueue", "/sys", "/sys/fs/cgroup"):
            continue
        if m["destination"] == "/dev/pts" and userns:
            # Only uid/gid 0 are mapped (like bwrap), so gid=5 (tty) does not
            # exist inside the user namespace and the devpts mount would fail.
            m["options"] = [o for o in m["options"] if not o.startswith("gid=")]
        mounts.append(m)
    mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777"]})
    mounts.append({"destination": "/usr", "type": "bind", "source": "/usr",
                   "options": ["rbind", "ro", "nosuid", "nodev"]})
    spec["mounts"] = mounts

    linux = spec["linux"]
    ns = ["pid", "network", "ipc", "uts", "mount", "cgroup"]
    if userns:
        ns.append("user")
        # A 1:1 map of root, the same thing bwrap does when run as root.
        linux["uidMappings"] = [{"containerID": 0, "hostID": 0, "size": 1}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": 0, "size": 1}]
    linux["namespaces"] = [{"type": t} for t in ns]
    # An absolute path puts the group at /sys/fs/cgroup/<ctrl>/corral-bench/…,
    # never inside cgroups owned by someone else.
    linux["cgroupsPath"] = f"/corral-bench/{cgroup_name}"
    res = linux.setdefault("resources", {})
    res["memory"] = {"limit": 512 * MIB}
    res["pids"] = {"limit": 256}

    with open(path, "w") as f:
        json.dump(spec, f, indent=2)


if __name__ == "__main__":
    main()
