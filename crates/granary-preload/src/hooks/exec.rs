//! The C entry points of the calls that start programs: `execve`, `execv`, `execvp`,
//! `execvpe`, `fexecve`, `posix_spawn`, `posix_spawnp`. The call runs with the caller's
//! arguments, its environment with granary's variables put back when they were cleared
//! (`ops::exec`, which also notes whether the new program will get granary). The
//! variadic `execl*` calls are not seen (glibc builds their argument vector and calls its
//! internal `execve`).

use core::ffi::{c_char, c_int};

use crate::ops::exec::{self, current_env, EnvBuf, Target};
use crate::sys::{real, sys};

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;
type FexecveFn = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut buf = EnvBuf::new();
    let s = exec::before(Target::Path(path), argv, envp, &mut buf);
    let r = real!(EXECVE as ExecveFn, (path, argv, s.envp)
        else sys!(libc::SYS_execve, path, argv, s.envp) as c_int);
    exec::failed(s.counted);
    r
}

/// `execv` passes the current environment: when granary's variables had to be put back, the
/// call becomes `execve` with the new one.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let mut buf = EnvBuf::new();
    let env = current_env();
    let s = exec::before(Target::Path(path), argv, env, &mut buf);
    let r = if s.envp == env {
        real!(EXECV as ExecvFn, c"execv", (path, argv) or -1)
    } else {
        real!(EXECVE as ExecveFn, (path, argv, s.envp)
            else sys!(libc::SYS_execve, path, argv, s.envp) as c_int)
    };
    exec::failed(s.counted);
    r
}

/// As `execv`: `execvpe` with the new environment when it had to be made.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    let mut buf = EnvBuf::new();
    let env = current_env();
    let s = exec::before(Target::Search(file), argv, env, &mut buf);
    let r = if s.envp == env {
        real!(EXECVP as ExecvFn, c"execvp", (file, argv) or -1)
    } else {
        real!(EXECVPE as ExecveFn, c"execvpe", (file, argv, s.envp) or -1)
    };
    exec::failed(s.counted);
    r
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut buf = EnvBuf::new();
    let s = exec::before(Target::Search(file), argv, envp, &mut buf);
    let r = real!(EXECVPE as ExecveFn, c"execvpe", (file, argv, s.envp) or -1);
    exec::failed(s.counted);
    r
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let mut buf = EnvBuf::new();
    let s = exec::before(Target::Fd(fd), argv, envp, &mut buf);
    let r = real!(FEXECVE as FexecveFn, c"fexecve", (fd, argv, s.envp) or -1);
    exec::failed(s.counted);
    r
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let mut buf = EnvBuf::new();
    let s = exec::before(Target::Path(path), argv.cast(), envp.cast(), &mut buf);
    let envp: *const *mut c_char = s.envp.cast();
    let r = real!(POSIX_SPAWN as SpawnFn, c"posix_spawn", (pid, path, actions, attr, argv, envp)
        or libc::ENOSYS);
    if r != 0 {
        exec::failed(s.counted);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let mut buf = EnvBuf::new();
    let s = exec::before(Target::Search(file), argv.cast(), envp.cast(), &mut buf);
    let envp: *const *mut c_char = s.envp.cast();
    let r = real!(POSIX_SPAWNP as SpawnFn, c"posix_spawnp", (pid, file, actions, attr, argv, envp)
        or libc::ENOSYS);
    if r != 0 {
        exec::failed(s.counted);
    }
    r
}
