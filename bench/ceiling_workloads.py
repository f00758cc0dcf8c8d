"""The workloads `mount_ceiling.sh` and `uring_ceiling.sh` time on each file system:
a shell command (`find`, the Andrew-like job), and PostMark with 2000 files and 20000
transactions. `work` is the script's scratch directory (PostMark's configuration, and
the Lua sources with their Makefile at `work/lua`)."""
import os, re, shutil, subprocess, time


def timed(cmd, cwd):
    """Seconds the shell command `cmd` takes in `cwd` (its output dropped)."""
    t = time.perf_counter()
    subprocess.run(cmd, shell=True, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def postmark(work, dir):
    """PostMark in `dir/pm`: its transactions per second, and our wall time of the run."""
    os.makedirs(f"{dir}/pm", exist_ok=True)
    with open(f"{work}/pm.cfg", "w") as f:
        f.write(f"set location {dir}/pm\nset number 2000\nset transactions 20000\nrun\nquit\n")
    t = time.perf_counter()
    out = subprocess.run(["postmark", f"{work}/pm.cfg"], check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t
    tps = float(re.search(r"seconds of transactions \((\d+) per second\)", out).group(1))
    shutil.rmtree(f"{dir}/pm", ignore_errors=True)
    return tps, wall


def andrew(work):
    """The Andrew-like job, run in the directory under test: copy Lua's sources in, list
    them, search them, build them, remove them."""
    return (f"cp -r {work}/lua src && ls -lR src > /dev/null && grep -r lua_State src > /dev/null"
            " && make -s -C src > /dev/null && rm -r src")
