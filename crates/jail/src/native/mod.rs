//! The native backend: Linux namespaces, overlayfs, cgroups, seccomp and Landlock.
