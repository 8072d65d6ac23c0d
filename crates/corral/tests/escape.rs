//! The escape suite: hostile code tries to leave its sandbox. Each test names the promise it
//! checks; the module list reads as corral's security model. Every test would fail if its
//! promise broke (and several were seen failing while the jail was being built).
//!
//! Runs as root on the host, through `corral run` (no daemon needed). Daemon-level attacks
//! (file API traversal, one sandbox bombing while another answers) live in `daemon_escape.rs`.

mod support;

use support::*;

mod host_files {
    use super::*;

    #[test]
    fn host_shadow_file_is_not_visible() {
        let run = sh_root("cat /etc/shadow");
        assert_ne!(run.code, 0, "{run:?}");
        assert!(run.stderr.contains("No such file"), "{run:?}");
    }

    #[test]
    fn host_users_are_not_listed_in_passwd() {
        let run = sh("cat /etc/passwd");
        assert_eq!(run.code, 0, "{run:?}");
        let names: Vec<&str> = run.stdout.lines().filter_map(|l| l.split(':').next()).collect();
        assert_eq!(names, ["root", "user", "nobody"]);
    }

    #[test]
    fn marker_planted_in_host_root_home_is_invisible_even_to_sandbox_root() {
        let name = format!("corral-marker-{}", std::process::id());
        let marker = std::path::Path::new("/root").join(&name);
        std::fs::write(&marker, "secret").expect("plant marker");
        let run = sh_root(&format!("ls -a /root; cat /root/{name}"));
        let _ = std::fs::remove_file(&marker);
        assert_ne!(run.code, 0, "{run:?}");
        assert!(!run.stdout.contains(&name) && !run.stdout.contains("secret"), "{run:?}");
    }

    #[test]
    fn marker_planted_in_host_tmp_is_not_found_anywhere_in_the_sandbox() {
        let dir = std::env::temp_dir().join(format!("corral-planted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let name = format!("planted-{}.txt", std::process::id());
        std::fs::write(dir.join(&name), "secret").expect("plant marker");
        let run = sh_root(&format!("find / -path /proc -prune -o -name '{name}' -print 2>/dev/null; echo done"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(run.stdout.contains("done"), "{run:?}");
        assert!(!run.stdout.contains(&name), "{run:?}");
    }

    #[test]
    fn daemon_data_dir_is_not_visible() {
        let data = data_dir().display().to_string();
        let run = sh_root(&format!("ls {data}"));
        assert_ne!(run.code, 0, "{run:?}");
    }

    #[test]
    fn host_state_directories_are_empty_or_absent() {
        let run = sh_root("ls -A /var/lib /run /srv /home /mnt 2>&1; ls -A /var");
        // /var holds only the sandbox's own tmp; /home only the sandbox user.
        assert!(run.stdout.contains("ls: cannot access '/var/lib'"), "{run:?}");
        assert!(!run.stdout.contains("corral-test"), "{run:?}");
        let var: Vec<&str> = run.stdout.lines().rev().take(1).collect();
        assert_eq!(var, ["tmp"], "{run:?}");
    }

    #[test]
    fn host_system_directories_are_read_only_even_for_sandbox_root() {
        let run = sh_root("touch /usr/corral-escape; echo $?");
        assert!(run.stderr.contains("Read-only file system"), "{run:?}");
        let run = sh_root("echo x > /etc/ssl/certs/corral-escape");
        assert!(run.stderr.contains("Read-only file system"), "{run:?}");
    }

    #[test]
    fn sandbox_system_files_are_not_writable_by_the_default_user() {
        let run = sh("stat -c '%a %U %n' /etc/passwd /etc/hosts /etc /tmp /home/user /etc/ssl; echo x >> /etc/passwd");
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines, ["644 root /etc/passwd", "644 root /etc/hosts", "755 root /etc", "1777 root /tmp", "750 user /home/user", "755 root /etc/ssl"]);
        assert!(run.stderr.contains("Permission denied"), "{run:?}");
    }

    #[test]
    fn writes_outside_read_only_dirs_stay_in_the_sandbox_layer() {
        let run = sh_root("echo inside > /opt/corral-escape && cat /opt/corral-escape");
        assert_eq!(run.stdout.trim(), "inside", "{run:?}");
        assert!(!std::path::Path::new("/opt/corral-escape").exists());
    }
}

mod proc_and_sys {
    use super::*;

    #[test]
    fn host_processes_are_invisible() {
        let run = sh("ls /proc | grep -E '^[0-9]+$' | wc -l");
        let count: usize = run.stdout.trim().parse().expect("count");
        // init, sh, ls, grep, wc at most.
        assert!(count <= 6, "saw {count} processes: {run:?}");
    }

    #[test]
    fn pid_one_is_the_corral_init_not_the_host_init() {
        let run = sh("cat /proc/1/cmdline | tr '\\0' ' '");
        assert!(run.stdout.contains("corral"), "{run:?}");
    }

    #[test]
    fn kcore_is_absent_or_masked() {
        // Some kernels have no /proc/kcore; where it exists it must read as empty.
        let run = sh_root("if [ -e /proc/kcore ]; then wc -c < /proc/kcore; else echo absent; fi");
        assert!(["0", "absent"].contains(&run.stdout.trim()), "{run:?}");
    }

    #[test]
    fn kallsyms_is_masked() {
        let run = sh_root("wc -c < /proc/kallsyms");
        assert_eq!(run.stdout.trim(), "0", "{run:?}");
    }

    #[test]
    fn sysrq_trigger_cannot_reach_the_host_kernel() {
        // Masked by /dev/null: the write "succeeds" into nothing; the host must not see it.
        let run = sh_root("if [ -e /proc/sysrq-trigger ]; then echo h > /proc/sysrq-trigger; wc -c < /proc/sysrq-trigger; else echo absent; fi");
        assert!(["0", "absent"].contains(&run.stdout.trim()), "{run:?}");
    }

    #[test]
    fn proc_sys_is_read_only() {
        let run = sh_root("echo 1 > /proc/sys/vm/drop_caches");
        assert_ne!(run.code, 0, "{run:?}");
        assert!(run.stderr.contains("Read-only") || run.stderr.contains("Permission denied"), "{run:?}");
    }

    #[test]
    fn sysfs_is_absent() {
        let run = sh_root("ls /sys");
        assert_ne!(run.code, 0, "{run:?}");
    }

    #[test]
    fn cgroup_view_is_rooted_at_the_sandbox() {
        let run = sh("cat /proc/self/cgroup");
        for line in run.stdout.lines() {
            let path = line.splitn(3, ':').nth(2).unwrap_or("");
            assert!(path == "/" || !path.contains("corral"), "host cgroup path leaked: {line}");
        }
    }
}

mod kernel_surface {
    use super::*;

    fn denied(nr: i64, args: &[u64]) {
        let (ret, errno) = raw_syscall_as_root(nr, args);
        assert_eq!((ret, errno), (-1, EPERM), "syscall {nr} was not denied");
    }

    #[test]
    fn mount_is_denied_to_sandbox_root() {
        let run = sh_root("mount -t tmpfs none /mnt");
        assert_ne!(run.code, 0, "{run:?}");
        denied(libc::SYS_mount, &[0, 0, 0, 0, 0]);
    }

    #[test]
    fn umount_and_pivot_root_are_denied() {
        denied(libc::SYS_umount2, &[0, 0]);
        denied(libc::SYS_pivot_root, &[0, 0]);
    }

    #[test]
    fn new_user_namespace_is_denied() {
        let run = sh("unshare -U true");
        assert_ne!(run.code, 0, "{run:?}");
        denied(libc::SYS_unshare, &[libc::CLONE_NEWUSER as u64]);
    }

    #[test]
    fn clone_with_namespace_flags_is_denied() {
        denied(libc::SYS_clone, &[(libc::CLONE_NEWNET | libc::SIGCHLD) as u64, 0, 0, 0, 0]);
    }

    #[test]
    fn clone3_is_unavailable_so_flags_stay_checkable() {
        let (ret, errno) = raw_syscall_as_root(libc::SYS_clone3, &[0, 0]);
        assert_eq!((ret, errno), (-1, ENOSYS));
    }

    #[test]
    fn setns_is_denied() {
        denied(libc::SYS_setns, &[0, 0]);
    }

    #[test]
    fn ptrace_and_cross_process_memory_access_are_denied() {
        denied(libc::SYS_ptrace, &[16, 1, 0, 0]);
        denied(libc::SYS_process_vm_readv, &[1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn bpf_and_perf_events_are_denied() {
        denied(libc::SYS_bpf, &[0, 0, 0]);
        denied(libc::SYS_perf_event_open, &[0, 0, 0, 0, 0]);
    }

    #[test]
    fn io_uring_and_userfaultfd_are_denied() {
        denied(libc::SYS_io_uring_setup, &[1, 0]);
        denied(libc::SYS_userfaultfd, &[0]);
    }

    #[test]
    fn kernel_keyrings_are_denied() {
        denied(libc::SYS_keyctl, &[0, 0, 0, 0, 0]);
        denied(libc::SYS_add_key, &[0, 0, 0, 0, 0]);
        denied(libc::SYS_request_key, &[0, 0, 0, 0]);
    }

    #[test]
    fn module_loading_and_kexec_are_denied() {
        denied(libc::SYS_init_module, &[0, 0, 0]);
        denied(libc::SYS_finit_module, &[0, 0, 0]);
        denied(libc::SYS_kexec_load, &[0, 0, 0, 0]);
    }

    #[test]
    fn open_by_handle_at_is_denied() {
        denied(libc::SYS_open_by_handle_at, &[0, 0, 0]);
    }

    #[test]
    fn every_process_runs_with_seccomp_and_no_new_privs() {
        let run = sh("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status");
        assert!(run.stdout.contains("Seccomp:\t2"), "{run:?}");
        assert!(run.stdout.contains("NoNewPrivs:\t1"), "{run:?}");
    }

    #[test]
    fn terminal_injection_ioctl_is_denied() {
        let run = python_with(
            &["--user", "root"],
            "import fcntl, os, termios, errno\nm, s = os.openpty()\n\
             try:\n    fcntl.ioctl(s, termios.TIOCSTI, b'x'); print('allowed')\n\
             except OSError as e:\n    print(errno.errorcode[e.errno])",
        );
        assert_eq!(run.stdout.trim(), "EPERM", "{run:?}");
    }
}

mod devices {
    use super::*;

    #[test]
    fn creating_device_nodes_fails_even_for_root() {
        let run = sh_root("mknod /tmp/mem c 1 1");
        assert_ne!(run.code, 0, "{run:?}");
    }

    #[test]
    fn only_harmless_devices_exist() {
        let run = sh_root("ls /dev");
        let names: Vec<&str> = run.stdout.split_whitespace().collect();
        for forbidden in ["vda", "sda", "mem", "kmem", "kmsg", "port", "kvm", "fuse", "net"] {
            assert!(!names.contains(&forbidden), "/dev/{forbidden} is visible: {names:?}");
        }
        assert!(names.contains(&"null") && names.contains(&"urandom") && names.contains(&"pts"));
    }

    #[test]
    fn raw_disk_cannot_be_opened() {
        let run = sh_root("cat /dev/vda | head -c 1");
        assert!(run.stderr.contains("No such file"), "{run:?}");
    }
}

mod network {
    use super::*;
    use std::net::{TcpListener, UdpSocket};
    use std::time::Duration;

    #[test]
    fn only_loopback_exists_and_there_is_no_route() {
        let run = sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo routes; tail -n +2 /proc/net/route | wc -l");
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines, ["lo", "routes", "0"], "{run:?}");
    }

    #[test]
    fn tcp_to_a_host_service_on_loopback_fails() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let run = python_with(
            &[],
            &format!(
                "import socket\ns = socket.socket()\ns.settimeout(2)\n\
                 try:\n    s.connect(('127.0.0.1', {port})); print('connected')\n\
                 except OSError as e:\n    print('refused', e.errno)"
            ),
        );
        assert!(run.stdout.starts_with("refused"), "{run:?}");
        assert!(listener.accept().is_err(), "the host service saw a connection");
    }

    #[test]
    fn udp_to_a_host_service_on_loopback_never_arrives() {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = socket.local_addr().expect("addr").port();
        socket.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
        let run = python_with(
            &[],
            &format!("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'leak', ('127.0.0.1', {port}))\nprint('sent')"),
        );
        assert_eq!(run.code, 0, "{run:?}");
        let mut buf = [0u8; 16];
        assert!(socket.recv_from(&mut buf).is_err(), "datagram escaped the sandbox");
    }

    #[test]
    fn packet_sockets_are_denied_even_for_root() {
        let run = python_with(
            &["--user", "root"],
            "import socket, errno\ntry:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('allowed')\n\
             except OSError as e:\n    print(errno.errorcode[e.errno])",
        );
        assert_eq!(run.stdout.trim(), "EPERM", "{run:?}");
    }

    #[test]
    fn raw_ip_sockets_are_denied_to_the_default_user() {
        let run = python_with(
            &[],
            "import socket, errno\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print('allowed')\n\
             except OSError as e:\n    print(errno.errorcode[e.errno])",
        );
        assert_eq!(run.stdout.trim(), "EPERM", "{run:?}");
    }

    #[test]
    fn host_abstract_unix_sockets_are_unreachable() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("corral-escape-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind abstract");
        listener.set_nonblocking(true).expect("nonblocking");
        let run = python_with(
            &["--user", "root"],
            &format!("import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0{name}'); print('connected')\nexcept OSError as e:\n    print('failed', e.errno)"),
        );
        assert!(run.stdout.starts_with("failed"), "{run:?}");
        assert!(listener.accept().is_err());
    }

    #[test]
    fn loopback_inside_works_for_local_servers() {
        let run = python_with(
            &[],
            "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
             c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.send(b'ok'); print(a.recv(2).decode())",
        );
        assert_eq!(run.stdout.trim(), "ok", "{run:?}");
    }
}

mod privilege {
    use super::*;

    #[test]
    fn default_user_has_no_capabilities() {
        let run = sh("grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status");
        for line in run.stdout.lines() {
            assert!(line.ends_with("0000000000000000"), "{line}");
        }
        assert_eq!(run.stdout.lines().count(), 4, "{run:?}");
    }

    #[test]
    fn default_user_is_uid_1000() {
        let run = sh("id -u; id -g; echo $HOME");
        assert_eq!(run.stdout.lines().collect::<Vec<_>>(), ["1000", "1000", "/home/user"]);
    }

    #[test]
    fn sandbox_root_is_an_unprivileged_host_uid() {
        let run = sh_root("cat /proc/self/uid_map");
        let fields: Vec<u64> = run.stdout.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        assert_eq!(fields.len(), 3, "{run:?}");
        assert_eq!(fields[0], 0);
        assert!(fields[1] >= 100_000, "sandbox root maps to host uid {}", fields[1]);
        assert_eq!(fields[2], 65_536);
    }

    #[test]
    fn files_written_by_sandbox_root_to_a_volume_belong_to_an_unprivileged_host_uid() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("corral-volume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
        let flag = format!("{}:/data", dir.display());
        let run = sh_with(&["--user", "root", "-v", &flag], "echo x > /data/owned");
        let meta = std::fs::metadata(dir.join("owned"));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(run.code, 0, "{run:?}");
        assert!(meta.expect("file").uid() >= 100_000);
    }

    #[test]
    fn setuid_binaries_do_not_elevate() {
        let run = sh("ls -l /usr/bin/su; su -c id root < /dev/null; echo uid=$(id -u)");
        assert!(run.stdout.contains("uid=1000"), "{run:?}");
        assert!(!run.stdout.contains("uid=0("), "{run:?}");
    }

    #[test]
    fn commands_start_with_default_signal_handling() {
        // Even when corral itself was started with SIGINT ignored (a shell background job).
        let mut command = std::process::Command::new("/bin/sh");
        command.env("CORRAL_DATA_DIR", data_dir()).args([
            "-c",
            "trap '' INT QUIT; exec \"$0\" run -- /bin/sh -c \"grep -E '^Sig(Ign|Blk):' /proc/self/status\"",
            env!("CARGO_BIN_EXE_corral"),
        ]);
        let run: Run = command.output().expect("run").into();
        let mask = |name: &str| {
            run.stdout.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).expect("mask")
        };
        // Standard signals 1-31; glibc keeps 32 and 33 for itself.
        assert_eq!(mask("SigIgn:") & 0x7fff_ffff, 0, "{run:?}");
        assert_eq!(mask("SigBlk:") & 0x7fff_ffff, 0, "{run:?}");
    }

    #[test]
    fn sandbox_root_cannot_kill_the_init() {
        let run = sh_root("kill -9 1; kill -TERM 1; sleep 0.2; echo alive");
        assert_eq!(run.stdout.trim(), "alive", "{run:?}");
        assert_eq!(run.code, 0, "{run:?}");
    }
}

mod resources {
    use super::*;
    use std::time::Instant;

    #[test]
    fn fork_bomb_is_stopped_at_the_pids_limit() {
        let start = Instant::now();
        let run = python_with(
            &["--pids", "32", "--timeout", "20s"],
            r#"
import os, time
n = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    n += 1
print(n)
"#,
        );
        let forked: usize = run.stdout.trim().parse().unwrap_or(usize::MAX);
        assert!(forked < 32, "forked {forked} processes: {run:?}");
        assert!(start.elapsed().as_secs() < 20);
    }

    #[test]
    fn memory_bomb_is_oom_killed_inside_the_sandbox_only() {
        let run = python_with(&["--memory", "64M"], "x = []\nwhile True:\n    x.append(bytearray(8 * 1024 * 1024))");
        assert_eq!(run.code, 137, "{run:?}");
        assert!(run.stderr.contains("out of memory"), "{run:?}");
    }

    #[test]
    fn cpu_hog_is_held_to_its_quota() {
        let run = python_with(
            &["--cpus", "0.5"],
            "import os, time, resource\nfor _ in range(2):\n    if os.fork() == 0:\n        end = time.time() + 2\n        while time.time() < end: pass\n        os._exit(0)\n\
             os.wait(); os.wait()\nprint(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime)",
        );
        let cpu: f64 = run.stdout.trim().parse().expect("cpu seconds");
        // Two busy processes for 2 s would use about 4 s unlimited; half a core allows about 1 s.
        assert!(cpu < 1.6, "used {cpu} s of CPU: {run:?}");
    }

    #[test]
    fn disk_fill_stops_with_enospc_at_the_quota() {
        let run = sh_with(&["--disk", "16M"], "dd if=/dev/zero of=/tmp/fill bs=1M count=64; ls -l /tmp/fill | awk '{print $5}'");
        assert!(run.stderr.contains("No space left"), "{run:?}");
        let size: u64 = run.stdout.trim().parse().expect("size");
        assert!(size <= 16 * 1024 * 1024, "wrote {size} bytes");
    }

    #[test]
    fn fd_exhaustion_hits_the_per_process_limit() {
        let run = python_with(
            &[],
            "import os, errno\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n\
             except OSError as e:\n    print(errno.errorcode[e.errno], len(fds))",
        );
        let mut parts = run.stdout.split_whitespace();
        assert_eq!(parts.next(), Some("EMFILE"), "{run:?}");
        let opened: usize = parts.next().and_then(|n| n.parse().ok()).expect("count");
        assert!(opened <= 4096, "{opened}");
    }

    #[test]
    fn timeout_kills_the_whole_sandbox() {
        let start = Instant::now();
        let run = sh_with(&["--timeout", "1s"], "sleep 30 & sleep 30");
        assert_eq!(run.code, 137, "{run:?}");
        assert!(run.stderr.contains("timed out"), "{run:?}");
        assert!(start.elapsed().as_secs() < 10);
    }
}

mod other_sandboxes {
    use super::*;
    use std::process::Stdio;

    #[test]
    fn another_sandboxs_files_and_processes_are_invisible() {
        let marker = format!("neighbour-{}", std::process::id());
        let mut neighbour = corral()
            .args(["run", "--", "/bin/sh", "-c", &format!("echo x > /tmp/{marker}; exec -a {marker} sleep 5")])
            .stdout(Stdio::null())
            .spawn()
            .expect("start neighbour");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let run = sh_root(&format!("ls /tmp; cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' '"));
        let _ = neighbour.kill();
        let _ = neighbour.wait();
        assert!(!run.stdout.contains(&marker), "{run:?}");
    }

    #[test]
    fn each_sandbox_gets_its_own_host_id_range() {
        let a = sh_root("cat /proc/self/uid_map");
        let b = sh_root("cat /proc/self/uid_map");
        let base = |r: &Run| r.stdout.split_whitespace().nth(1).map(str::to_string);
        assert!(base(&a).is_some());
        // Ranges are chosen at random among 30,000 slots; sequential runs colliding is ~1/30000.
        assert_ne!(base(&a), base(&b));
    }
}
