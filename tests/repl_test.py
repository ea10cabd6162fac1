#!/usr/bin/env python3
"""repl_test.py: drives the interactive REPL through a real pseudo-terminal under mpiexec.

usage: repl_test.py TPSH [MPIEXEC]       (ctest: the `repl` test)

A pty (python's pty module) rather than tmux: one process, no shared server to race with, the exit
status comes straight from waitpid, and every wait has a deadline, so the test can fail but never hang.
mpiexec runs as the pty's foreground job, as it would from an interactive shell: the REPL then finds
the launcher's terminal (see src/host/repl_term.c). Each case checks one behaviour and reports PASS/FAIL;
the exit status is 1 if any case failed.
"""
import fcntl
import os
import re
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import time

TPSH = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else "build/tpsh"
MPIEXEC = sys.argv[2] if len(sys.argv) > 2 else "mpiexec"
# ranks: 2 by default; TPSH_REPL_NP=3 (ctest's repl_np3) checks the collapsing and ordering of an odd count
NP = int(os.environ.get("TPSH_REPL_NP", "2"))
ALL = "[0-%d]" % (NP - 1)                    # the label of a line that every rank printed alike
WORLD = ",".join(str(r) for r in range(NP))   # "0,1": the world's ranks as messages list them
OTHERS = ",".join(str(r) for r in range(1, NP))   # every rank but 0, as :on takes them and messages list them
PROMPT = "tpsh> "
ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>78M])|\x07|\r")
TMP = tempfile.mkdtemp(prefix="tpsh_repl_test_")
HISTORY = os.path.join(TMP, "history")

failures = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + ("" if ok or not detail else "\n     " + detail.replace("\n", "\n     ")))
    if not ok:
        failures.append(name)
    sys.stdout.flush()


class Session:
    """mpiexec -n NP tpsh on a fresh pty; text() is the screen output with escape sequences removed."""

    def __init__(self, extra_env=None):
        # REPL_TEST_BACKEND=cuda runs the same cases on the GPU machine (scripts/gpu/gpu_check.sh step repl)
        env = dict(os.environ, TPSH_HISTORY=HISTORY, HOME=TMP, TERM="xterm",
                   TPSH_BACKEND=os.environ.get("REPL_TEST_BACKEND", "cpu"))
        env.pop("TPSH_TIMEOUT", None)
        env.update(extra_env or {})
        # The slave stays open here too: on Linux only the slave side shows the settings the REPL sets.
        self.fd, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.setsid()
                fcntl.ioctl(self.slave, termios.TIOCSCTTY, 0)
                for fd in (0, 1, 2):
                    os.dup2(self.slave, fd)
                os.closerange(3, 256)
                os.execvpe(MPIEXEC, [MPIEXEC, "-n", str(NP), TPSH], env)
            finally:
                os._exit(127)
        # Non-blocking writes: a long paste then never blocks the test on a full pty (see send()).
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.raw = b""
        self.mark = 0          # text before this index has been consumed by expect()
        self.status = None

    def text(self):
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def pump(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if r:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            if not data:
                return False
            self.raw += data
        return True

    def expect(self, pattern, timeout=20):
        """Waits for the regex after the mark; returns the text from the mark to the end of the match."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.M)
        ended = False
        while True:
            t = self.text()
            m = rx.search(t, self.mark)
            if m:
                seen = t[self.mark:m.end()]
                self.mark = m.end()
                return seen
            left = deadline - time.monotonic()
            if ended or left <= 0:
                return None
            # once the session has ended (and what it wrote is drained), one more search, then give up
            ended = not self.pump(min(left, 0.2)) or self.exited(0)

    def send(self, s, timeout=30):
        """Writes s in pieces, reading the output meanwhile: the REPL echoes what it reads, and a test
        that only wrote would fill both directions of the pty. Gives up at the deadline or the end."""
        data = s.encode()
        deadline = time.monotonic() + timeout
        while data and time.monotonic() < deadline and self.status is None:
            r, w, _ = select.select([self.fd], [self.fd], [], 0.2)
            if r and not self.pump(0):
                return
            if w:
                try:
                    data = data[os.write(self.fd, data[:4096]):]
                except BlockingIOError:
                    pass
                except OSError:
                    return
            elif self.exited(0):
                return

    def run(self, line, timeout=20):
        """Types a line, returns what appeared until the next prompt (None on timeout)."""
        self.send(line + "\r")
        return self.expect(r"(?s).*?^" + re.escape(PROMPT), timeout)

    def wait_raw(self, needle, timeout=20):
        """Waits for the bytes needle in the output after the mark (no decoding: cheap on megabytes)."""
        deadline = time.monotonic() + timeout
        while needle not in self.raw and time.monotonic() < deadline and not self.exited(0):
            self.pump(0.1)
        return needle in self.raw

    def drain(self):
        """Reads what the pty still holds: a child that writes a line and exits at once (MPI_Abort after
        "ending the session") can be reaped before the reader has seen the line."""
        while True:
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if not r:
                return
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            self.raw += data

    def exited(self, timeout):
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                self.drain()
                break
            if time.monotonic() >= deadline:
                return False
            try:
                self.pump(0.1)
            except OSError:
                time.sleep(0.1)
        return True

    def check_ctrl_d_ends(self, name):
        """Ctrl-D at the prompt: the session must end, with status 0."""
        self.send("\x04")
        done = self.exited(20)
        check(name, done and self.status == 0,
              "exited: %s, status %s\n%s" % (done, self.status, self.text()[-400:]))
        return done

    def tty_restored(self, timeout=5):
        """The pty's settings have ISIG, ICANON and ECHO again (the REPL turns them off while it runs)."""
        want = termios.ISIG | termios.ICANON | termios.ECHO
        deadline = time.monotonic() + timeout
        while True:
            try:
                if termios.tcgetattr(self.slave)[3] & want == want:
                    return True
            except termios.error:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def close(self):
        if not self.exited(0):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
                if self.exited(3):
                    break
        for fd in (self.fd, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


def lines_of(out):
    return [l.rstrip() for l in (out or "").split("\n")]


# ---- the fuzz: random lines and exits ---------------------------------------------------------------
# (issue 45) Random lines (expressions, statements, errors, junk, long and incomplete lines, :on, :time,
# Ctrl-C) drive a session; after each one a prompt must come back within seconds, and each session ends
# by one of the exits (Ctrl-D, :quit, os.exit on every rank or on one, with a status) with that status,
# never a crash or a hang. Short here (TPSH_REPL_FUZZ_SESSIONS, TPSH_REPL_FUZZ_LINES); scripts/ci/fuzz_repl.sh
# runs it long, alone. The seed is printed: TPSH_REPL_FUZZ_SEED replays a failure.
def fuzz_line(rng):
    r = rng.random()
    if r < 0.15:
        return "=%d + %d" % (rng.randrange(100), rng.randrange(100))
    if r < 0.25:
        return 'print("x", tp.rank, %d)' % rng.randrange(10)
    if r < 0.32:
        return 'error("fuzz %d")' % rng.randrange(10)
    if r < 0.40:
        return ":on %d print(%d)" % (rng.randrange(NP), rng.randrange(10))
    if r < 0.45:
        return ":time local t = tp.ones{%d}; t:add_(1)" % rng.randrange(1, 64)
    if r < 0.50:
        return "local s = '" + "z" * rng.choice((10, 3000, 20000)) + "' print(#s)"
    if r < 0.55:
        return rng.choice(("function f(", "do", "x = {", "local t = [[", "if true then"))   # incomplete
    if r < 0.60:
        return rng.choice((":help", ":ranks", ":on", ":on 9x", ":nope", "=", ""))
    if r < 0.65:
        return "x = tp.ones{3} print(x:sum():item())"
    junk = "()[]{}+-*/=.,;:'\"#%^ 0123456789xy\\"
    return "".join(rng.choice(junk) for _ in range(rng.randrange(1, 60)))


EXITS = (("\x04", 0), (":quit", 0), ("os.exit(0)", 0), ("os.exit(5)", 5), (":on %d os.exit(3)" % (NP - 1), 3),
         ("pcall(os.exit, 9)", 9))


def fuzz(sessions, lines, seed):
    import random
    rng = random.Random(seed)
    print("fuzz: %d session(s) of %d line(s), seed %d" % (sessions, lines, seed))
    prompt_rx = r"(?s).*?^(" + re.escape(PROMPT) + r"|>> )"
    for k in range(sessions):
        s = Session()
        log = []
        try:
            ok = s.expect(re.escape(PROMPT), 30) is not None
            for _ in range(lines if ok else 0):
                line = fuzz_line(rng)
                log.append(line[:80])
                s.send(line + "\r")
                out = s.expect(prompt_rx, 20)
                if out is not None and out.endswith(">> "):
                    s.send("\x03")                       # the chunk goes on: discard it
                    out = s.expect(r"(?s).*?^" + re.escape(PROMPT), 20)
                if out is None or s.status is not None:
                    ok = False
                    break
            chunk, want = EXITS[rng.randrange(len(EXITS))]
            log.append(chunk)
            s.send(chunk if chunk == "\x04" else chunk + "\r")
            done = s.exited(20)
            t = s.text()
            check("fuzz session %d (seed %d): every line got its prompt back, and %r ended it with status %d"
                  % (k + 1, seed, chunk, want),
                  ok and done and s.status == want and "BAD TERMINATION" not in t,
                  "ok %s, exited %s, status %s; last lines %r\n%s" % (ok, done, s.status, log[-5:], t[-600:]))
        finally:
            s.close()


def main():
    fuzz_seed = int(os.environ.get("TPSH_REPL_FUZZ_SEED") or int(time.time()) % 100000)
    if os.environ.get("TPSH_REPL_FUZZ_ONLY"):
        fuzz(int(os.environ.get("TPSH_REPL_FUZZ_SESSIONS", "4")), int(os.environ.get("TPSH_REPL_FUZZ_LINES", "200")),
             fuzz_seed)
        print("%d failed" % len(failures) if failures else "all passed")
        return 1 if failures else 0
    # ---- piped stdin: the whole input is one script, output not prefixed -------------------------
    p = subprocess.run([MPIEXEC, "-n", str(NP), TPSH], input="print(tp.rank)\n", capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, TPSH_BACKEND="cpu"))
    # The launcher forwards each rank's bytes as they come, so lines of two ranks may interleave.
    got = sorted(p.stdout.replace("\n", ""))
    check("piped stdin runs the input as a script on every rank, output not prefixed",
          p.returncode == 0 and got == sorted("".join(str(r) for r in range(NP))) and "[" not in p.stdout,
          "status %d, stdout %r, stderr %r" % (p.returncode, p.stdout, p.stderr))

    s = Session()
    try:
        check("banner and prompt", s.expect(re.escape(PROMPT), 30) is not None, s.text())

        out = s.run("=1+1")
        check("=expr prints the value once for identical ranks", (ALL + " 2") in lines_of(out), out)

        out = s.run("10 * 3")
        check("a bare expression prints its value", (ALL + " 30") in lines_of(out), out)

        out = s.run("print(tp.rank)")
        ls = lines_of(out)
        check("distinct output per rank, in rank order",
              "[0] 0" in ls and "[1] 1" in ls and ls.index("[0] 0") < ls.index("[1] 1"), out)

        out = s.run('print("same")')
        ls = lines_of(out)
        check(("identical output collapsed to " + ALL), (ALL + " same") in ls and "[0] same" not in ls, out)

        s.send("function twice(x)\r")
        cont = s.expect(r"^>> ", 10)
        check("incomplete chunk gives the continuation prompt", cont is not None, s.text()[-400:])
        s.send("  return 2 * x\r")
        s.expect(r"^>> ", 10)
        out = s.run("end")
        check("multi-line chunk is accepted", out is not None and "error" not in (out or ""), out)
        out = s.run("twice(21)")
        check("function from the multi-line chunk works on every rank", (ALL + " 42") in lines_of(out), out)

        out = s.run('error("boom")')
        check("an error is shown with its ranks", (ALL + " error: stdin:1: boom") in lines_of(out), out)
        out = s.run('print("still here", tp.rank)')
        ls = lines_of(out)
        check("the session goes on after an error", "[0] still here\t0" in ls and "[1] still here\t1" in ls, out)

        out = s.run(':on 1 print("only")')
        ls = lines_of(out)
        check(":on 1 runs on rank 1 only", "[1] only" in ls and not any("only" in l and l.startswith("[0")
                                                                   for l in ls), out)

        out = s.run(":ranks")
        ls = lines_of(out)
        check(":ranks lists every rank", any(l.startswith("[0] host ") for l in ls) and
              any(l.startswith("[1] host ") for l in ls), out)

        # one line per rank, or fewer when ranks measured the same (identical lines are collapsed to
        # "[0-1]"): every rank must be covered once
        out = s.run(":time x = 1")
        covered = []
        for label in re.findall(r"^\[([\d,-]+)\] host [\d.]+ ms, device [\d.]+ ms", out or "", re.M):
            for part in label.split(","):
                lo, _, hi = part.partition("-")
                covered += range(int(lo), int(hi or lo) + 1)
        check(":time shows host and device time per rank", sorted(covered) == list(range(NP)), out)

        s.send("while true do end\r")
        time.sleep(1.0)
        s.send("\x03")
        out = s.expect(r"(?s).*?^" + re.escape(PROMPT), 15)
        check("Ctrl-C interrupts a running chunk on every rank, at the chunk's line",
              (ALL + " error: stdin:1: interrupted") in lines_of(out), out if out is not None else s.text()[-600:])
        out = s.run('print("alive")')
        check("the session goes on after Ctrl-C", (ALL + " alive") in lines_of(out), out)

        # A host wait (tp.synchronize, a read, w:block) is interrupted too, in about the time it takes
        # Ctrl-C to go round, not at the end of the work it waits for; the error names the call and the
        # chunk's line, not a line of tpsh's own Lua (audit, 2026-12-01: the chunk ran to the end of the
        # spin, then named tensor.lua)
        # (6 s spins: the host returns after about 1 s; the rest, 10 s, drains before the Ctrl-D below)
        for call, chunk in (("tp.synchronize", "tp.spin(6000); tp.synchronize()"),
                            ("tensor:item", "tp.spin(6000); print(tp.ones(1):sum():item())")):
            t0 = time.monotonic()
            s.send(chunk + "\r")
            time.sleep(1.0)
            s.send("\x03")
            out = s.expect(r"(?s).*?^" + re.escape(PROMPT), 15)
            took = time.monotonic() - t0
            check("Ctrl-C interrupts a host wait in %s at once, naming it and the chunk's line" % call,
                  out is not None and took < 4.5 and
                  (ALL + " error: stdin:1: %s: interrupted while the host waited for a stream") % call in out,
                  "after %.1f s: %s" % (took, out if out is not None else s.text()[-600:]))
        out = s.run('print("alive")')
        check("the session goes on after an interrupted host wait", (ALL + " alive") in lines_of(out), out)

        # Ctrl-C in a chunk that :on left the other ranks out of: their interrupt messages are never
        # received while a chunk runs there, and were left for MPI_Finalize, which complained at the end
        # of the session ("UCX WARN unexpected tag-receive descriptor ... was not matched")
        s.send(":on 0 while true do end\r")
        time.sleep(1.0)
        s.send("\x03")
        out = s.expect(r"(?s).*?^" + re.escape(PROMPT), 15)
        check("Ctrl-C interrupts an :on chunk", out is not None and "[0] error: stdin:1: interrupted" in out,
              out if out is not None else s.text()[-600:])

        s.check_ctrl_d_ends("Ctrl-D ends every rank with status 0")
        check("no interrupt message is left unreceived at the end of the session",
              "was not matched" not in s.text(), s.text()[-600:])
        check("the terminal's settings are restored at the end", s.tty_restored())
    finally:
        s.close()

    st = os.stat(HISTORY) if os.path.exists(HISTORY) else None
    hist = open(HISTORY, errors="replace").read() if st else ""
    check("history saved with mode 0600", st is not None and stat.S_IMODE(st.st_mode) == 0o600 and
          "twice" in hist, "stat %r" % (st,))

    # ---- collectives that not every rank called, or that the ranks called differently ----------------
    # Said after the command (neither raises anywhere without check mode); the end of the session then
    # compares the ranks' collectives as a script's end does, and ends it with status 1.
    s = Session()
    try:
        s.expect(re.escape(PROMPT), 30)
        # (the first collective connects NCCL's ranks)
        out = s.run("tp.world:all_reduce(tp.ones{4}); tp.synchronize()")
        check("collectives that every rank called alike draw no line", "tpsh:" not in (out or ""), out)
        # (on the world's comm stream: the default streams stay free for the next commands)
        out = s.run(":on 0 tp.world:all_reduce(tp.ones{4}, {async = true})")
        check("a collective that one rank called is said after the command",
              ("tpsh: the ranks have issued different numbers of collectives on group 0 (world ranks %s): rank 0 2, "
               "%s. The ones that not every rank called wait for the others"
               % (WORLD, ", ".join("rank %d 1" % r for r in range(1, NP)))) in (out or ""), out)
        # (the watchdog ends the session, at the prompt too, once such a collective has waited its timeout)
        check("that line says that the watchdog ends the session after --timeout",
              "wrong call; the watchdog ends the session once one has waited 600 s (--timeout)\n" in (out or ""), out)
        # (while the world's counts differ, another group is compared all the same; no synchronize, which
        # would wait for rank 0's all_reduce)
        out = s.run('g = tp.world:split(0); g:all_reduce(tp.ones{4}, {op = tp.rank == 0 and "sum" or "max"})')
        check("collectives that the ranks called differently are said after the command",
              re.search(r"^tpsh: in this command the ranks issued different collectives on group \d+ \(world ranks "
                        + WORLD + r"\): as many as each other, but rank 0's and rank 1's differ", out or "", re.M) is not None,
              out)
        check("uneven counts are said once while they stand", "different numbers" not in (out or ""), out)
        out = s.run(":on %s tp.world:all_reduce(tp.ones{4}, {async = true}):wait(); tp.synchronize()" % OTHERS)
        check("the rank that catches up draws no line", "tpsh:" not in (out or ""), out)
        out = s.run("g:all_reduce(tp.ones{4}); tp.synchronize()")
        check("the next command is compared on its own collectives", "tpsh:" not in (out or ""), out)

        s.send("\x04")
        done = s.exited(30)
        check("the session's end fails it, status 1, for collectives that the ranks called differently",
              done and s.status == 1 and "at the end of the script: the ranks issued different collectives" in s.text(),
              "exited: %s, status %s\n%s" % (done, s.status, s.text()[-600:]))
    finally:
        s.close()

    # ---- a tensor collective entered by one rank, its host waiting for it in tp.synchronize: Ctrl-C
    # ends the wait and the session goes on, the uneven counts said; the end of the session then ends
    # the run within seconds, as a script's end does (it waited for the 600 s timeout: audit, 2026-12-01)
    s = Session()
    try:
        s.expect(re.escape(PROMPT), 30)
        s.send(":on 0 local t = tp.ones{4}; tp.world:all_reduce(t); tp.synchronize()\r")
        time.sleep(1.0)
        s.send("\x03")
        out = s.expect(r"(?s).*?^" + re.escape(PROMPT), 15)
        check("Ctrl-C ends a host wait for a collective that one rank entered, and says so",
              out is not None and "[0] error: stdin:1: tp.synchronize: interrupted" in out and
              "different numbers of collectives" in out, out if out is not None else s.text()[-600:])
        t0 = time.monotonic()
        s.send("\x04")
        done = s.exited(30)
        check("the session's end then ends every rank within seconds, status 1, naming the collective",
              done and s.status == 1 and time.monotonic() - t0 < 20 and "it will not join it" in s.text() and
              "rank 1 has finished the interactive session and waits for the other ranks at its end" in s.text(),
              "exited: %s, status %s\n%s" % (done, s.status, s.text()[-600:]))
        check("the terminal's settings are restored after MPI_Abort (the session's end)", s.tty_restored())
    finally:
        s.close()

    # ---- a collective entered by some ranks only: Ctrl-C twice ends the session, never a hang --------
    # The host collective (tp.barrier), blocked in MPI, where no interrupt reaches.
    for what, chunk in (("a collective", "tp.barrier()"),):
        s = Session()
        try:
            s.expect(re.escape(PROMPT), 30)
            s.send(":on 0 %s\r" % chunk)
            time.sleep(1.0)
            s.send("\x03")
            hint = s.expect(r"still waiting for rank\(s\) 0\b.*", 10)
            check("a rank stuck in %s is named after Ctrl-C" % what, hint is not None, s.text()[-600:])
            # rank 1 (left out by :on) finished at once: the hint names rank 0 only
            check("the hint names only the ranks still running (%s)" % what,
                  hint is not None and re.search(r"still waiting for rank\(s\) 0, blocked", hint) is not None, hint)
            s.send("\x03")
            done = s.exited(20)
            check("a second Ctrl-C ends the session with a message and a non-zero status (%s)" % what,
                  done and s.status not in (None, 0) and "ending the session" in s.text(),
                  "status %s\n%s" % (s.status, s.text()[-600:]))
            check("the terminal's settings are restored after MPI_Abort (%s)" % what, s.tty_restored())
        finally:
            s.close()

    # ---- SIGTERM to mpiexec while a chunk runs (a scheduler's end of the job) ---------------------------
    # mpiexec passes it on to every rank: the terminal is restored and every rank ends through MPI_Abort
    # with status 143 and a line (src/host/main.c); died of the signal, the run was reported as 15 or 0.
    s = Session()
    try:
        s.expect(re.escape(PROMPT), 30)
        s.send("local t = tp.now() while tp.now() - t < 30000 do end\r")
        time.sleep(1.0)
        os.kill(s.pid, signal.SIGTERM)
        done = s.exited(20)
        check("SIGTERM to mpiexec ends every rank with status 143, saying so",
              done and s.status == 143 and "[rank 0] tpsh: ended by SIGTERM (status 143)" in s.text(),
              "exited: %s, status %s\n%s" % (done, s.status, s.text()[-600:]))
        check("the terminal's settings are restored after SIGTERM", s.tty_restored())
    finally:
        s.close()

    # ---- os.exit in a chunk ends the session on every rank with its status, within seconds ----------
    # (issue 45: os.exit(0) ended in a segfault, the listener thread of ranks > 0 probing while MPI
    # finalized; `:on 1 os.exit(0)` hung with no prompt, rank 0 waiting for a result that never came)
    last = OTHERS.split(",")[-1]
    for chunk, want in (("os.exit(0)", 0), ("os.exit(3)", 3), (":on %s os.exit(0)" % last, 0),
                        (":on 0 os.exit(7)", 7), ("print(pcall(os.exit, 4))", 4),
                        ('if tp.rank == %s then os.exit(true) end; print("ran on")' % last, 0)):
        s = Session()
        try:
            s.expect(re.escape(PROMPT), 30)
            t0 = time.monotonic()
            s.send(chunk + "\r")
            done = s.exited(15)
            t = s.text()
            check("%s ends every rank with status %d, saying so" % (chunk, want),
                  done and s.status == want and time.monotonic() - t0 < 10 and
                  ("ending the session on every rank with status %d" % want) in t and "BAD TERMINATION" not in t,
                  "exited: %s, status %s\n%s" % (done, s.status, t[-600:]))
            check("the terminal's settings are restored after %s" % chunk, s.tty_restored())
        finally:
            s.close()

    # ---- a chunk that fails on one rank before a collective: said within seconds, with no key --------
    s = Session()
    try:
        s.expect(re.escape(PROMPT), 30)
        # :on leaves rank 1 out on purpose: no word about it, however long rank 0 runs
        out = s.run(":on 0 local t = tp.now() while tp.now() - t < 4500 do end", 30)
        check("a long :on chunk draws no word about the rank it left out",
              out is not None and "still running" not in out, out if out is not None else s.text()[-600:])
        # two chunks typed at once: rank 0 runs on alone in the first (no error to quote), then the
        # second fails on rank 1 before a barrier; each is said (the second starts before the reader
        # thread ever sees the session idle)
        s.send("if tp.rank == 0 then local t = tp.now() while tp.now() - t < 4500 do end end\r"
               'if tp.rank == 1 then error("rank one fails") end; tp.barrier()\r')
        first = s.expect(r"tpsh: rank\(s\) 0 still running 3 s after rank\(s\) %s finished.*" % OTHERS, 15)
        check("a chunk that runs on alone on rank 0 is said within seconds",
              first is not None and "Ctrl-C interrupts" in first, s.text()[-600:])
        # (rank 0 is still in the first chunk, the ranks past 1 wait in the barrier)
        still = ",".join(str(r) for r in range(NP) if r != 1)
        hint = s.expect(r"tpsh: rank\(s\) %s still running 3 s after rank\(s\) 1 finished.*" % still, 15)
        check("so is the next, typed-ahead chunk, finished on rank 1 and still running on rank 0",
              hint is not None, s.text()[-600:])
        why = s.expect(r"tpsh:   rank 1 failed: .*", 5)
        check("the line quotes rank 1's error", why is not None and "rank one fails" in why, s.text()[-600:])
        s.send("\x03")
        s.expect(r"still waiting for rank\(s\) 0\b.*", 10)
        s.send("\x03")
        done = s.exited(20)
        check("that session ends at the second Ctrl-C", done and s.status not in (None, 0),
              "status %s\n%s" % (s.status, s.text()[-600:]))
    finally:
        s.close()

    # ---- a value whose display waits: showing `t:sum()` reads t, behind a collective only rank 0 issued.
    # The display is part of the chunk: rank 0 is the one still running, and Ctrl-C interrupts it (it
    # was formatted after the chunk was marked done: the line named the other ranks, rank 0 as finished,
    # and Ctrl-C did nothing until a second one ended the session).
    s = Session()
    try:
        s.expect(re.escape(PROMPT), 30)
        s.run("t = tp.ones(3); tp.world:all_reduce(t)", 30)
        s.run(":on 0 tp.world:all_reduce(t)", 30)
        s.send("t:sum()\r")
        line = s.expect(r"tpsh: rank\(s\) \S+ still running 3 s after rank\(s\) \S+ finished.*", 15)
        check("a value that waits while it is shown counts as running on its rank",
              line is not None and ("tpsh: rank(s) 0 still running 3 s after rank(s) %s finished" % OTHERS) in line,
              s.text()[-600:])
        s.send("\x03")
        out = s.expect(r"(?s).*?^" + re.escape(PROMPT), 15)
        check("Ctrl-C interrupts the display's wait, and the session goes on",
              out is not None and "[0] error: tostring: interrupted while the host waited" in out
              and "%s %d." % ("[1]" if NP == 2 else "[1-%d]" % (NP - 1), 3 * NP) in out, s.text()[-600:])
    finally:
        s.close()

    # ---- a rank stuck in C, with a timeout: the way out needs no key at all -------------------------
    # (A C sleep rather than a collective, which the core's own watchdog would report first.)
    s = Session({"TPSH_TIMEOUT": "1"})
    try:
        s.expect(re.escape(PROMPT), 30)
        s.send(':on 1 local ffi = require "ffi"; ffi.cdef "unsigned sleep(unsigned)"; ffi.C.sleep(60)\r')
        done = s.exited(20)
        t = s.text()
        check("with TPSH_TIMEOUT a stuck chunk is interrupted, then the session ends",
              done and s.status not in (None, 0) and "interrupting every rank" in t and "ending the session" in t,
              "status %s\n%s" % (s.status, t[-600:]))
        check("the timeout's abort message names the ranks and reads as one sentence",
              "tpsh: rank(s) 1 still not finished 1 s after the interrupt: ending the session" in t, t[-600:])
    finally:
        s.close()

    # ---- values that cannot be shown (this used to end the session on every rank) -------------------
    s = Session()
    try:
        s.expect(re.escape(PROMPT), 30)
        out = s.run('=setmetatable({}, {__tostring = function() error("bad tostring") end})')
        check("=expr whose __tostring raises shows an error line",
              out is not None and any(l.startswith((ALL + " error: ")) and "bad tostring" in l for l in lines_of(out)),
              out if out is not None else s.text()[-600:])
        out = s.run('error(setmetatable({}, {__tostring = function() error("bad tostring") end}))')
        check("an error object whose __tostring raises shows an error line",
              out is not None and any(l.startswith((ALL + " error: ")) for l in lines_of(out)),
              out if out is not None else s.text()[-600:])
        out = s.run('print("alive", tp.rank)')
        ls = lines_of(out)
        check("the session goes on after a failing __tostring", "[0] alive\t0" in ls and "[1] alive\t1" in ls,
              out if out is not None else s.text()[-600:])
    finally:
        s.close()

    # ---- long pastes, :on with a huge rank, stdin inside a chunk --------------------------------------
    s = Session()
    try:
        # ~20 KB on one line, written at once: every byte must arrive (the sum checks it). Typed ahead, as
        # soon as the banner shows and before the first prompt: the terminal must already be out of
        # canonical mode then, or the kernel keeps 4095 bytes of the line and drops the rest.
        s.expect("Ctrl-D ends the session", 30)
        check("the terminal is out of canonical mode when the banner shows",
              not termios.tcgetattr(s.slave)[3] & termios.ICANON)
        n = 2500
        line = "local s = 0 " + " ".join("s = s + %d" % i for i in range(1, n + 1)) + " print(s + tp.rank)"
        assert len(line) > 20000, len(line)
        s.send(line + "\r")
        out = s.expect(re.escape(PROMPT), 30) and s.expect(r"(?s).*?^" + re.escape(PROMPT), 60)
        total = n * (n + 1) // 2
        ls = lines_of(out)
        check("a 20 KB single-line paste arrives whole",
              "[0] %d" % total in ls and "[1] %d" % (total + 1) in ls,
              (out or s.text())[-600:])
        if out is None:                   # a line cut short never ends: discard it
            s.send("\x03")
            s.expect(re.escape(PROMPT), 10)

        # (issue 45) libedit redrew the whole line at each key it inserted: 40 KB took 17 s, 70 KB over 98 s,
        # and a 1 MB paste ended the run ("process reading stdin too slowly"), tpsh saying nothing. Pasted
        # lines are now read past the editor, in linear time; one that arrives slowly (as typed) too.
        for n, pieces in ((70000, 1), (1 << 20, 1), (6000, 60)):
            body = "x = '" + "b" * n + "' print(#x + tp.rank)"
            t0 = time.monotonic()
            step = -(-len(body) // pieces)
            for i in range(0, len(body), step):
                s.send(body[i:i + step])
                if pieces > 1:
                    time.sleep(0.01)
            s.send("\r")
            ok = s.wait_raw(("[0] %d" % n).encode(), 30) and s.wait_raw(("[1] %d" % (n + 1)).encode(), 5)
            took = time.monotonic() - t0
            check("a %d-byte line (%s) arrives whole and runs within seconds" % (n, "pasted" if pieces == 1 else "typed"),
                  ok and took < 10 and s.status is None, "after %.1f s, status %s: %r" % (took, s.status, s.raw[-300:]))
            s.expect(re.escape(PROMPT), 10)
            s.mark = len(s.text())
        out = s.run("=1+1")
        check("the session goes on after long lines", (ALL + " 2") in lines_of(out), out)

        out = s.run(":on 99999999999999999999 print(1)")
        check(":on names a rank that does not exist as typed",
              out is not None and "rank 99999999999999999999 does not exist" in out, out)

        # (audit, 2026-12-01) :on with no rank list or no chunk did nothing, ",1" was taken as "1"; an
        # error in =expr named line 2 of a one-line chunk; "=1 +" was refused instead of continuing
        for line, want in ((":on", "expected a rank list and a chunk"), (":on 0", "expected a rank list and a chunk"),
                           (":on ,1 print(1)", "bad rank list ',1'"), (":on 1, print(1)", "bad rank list '1,'"),
                           (":time", "tpsh: :time: expected a chunk"),
                           # (issue 45) `=` alone printed nothing at all
                           ("=", "tpsh: = expects an expression after it"), ("=  ", "tpsh: = expects an expression"),
                           # a range must go up, and a rank past the world's is named (repl.lua parse_ranks)
                           (":on 1-0 print(1)", "bad rank list '1-0'"),
                           (":on %d print(1)" % NP, "rank %d does not exist (ranks 0-%d)" % (NP, NP - 1)),
                           (":on 0-%d print(1)" % NP, "rank %d does not exist (ranks 0-%d)" % (NP, NP - 1))):
            out = s.run(line, 10)
            check("%s is refused with a usage line" % line, out is not None and want in out, out)
        out = s.run("=undefinedvar.x", 10)
        check("an error in =expr names the chunk's line 1",
              out is not None and (ALL + " error: stdin:1: attempt to index global 'undefinedvar'") in out, out)
        s.send("=1 +\r")
        cont = s.expect(r"^>> ", 10)
        out = s.run("2", 10)
        check("=1 + continues on the next line", cont is not None and out is not None and (ALL + " 3") in lines_of(out),
              out if cont is not None else s.text()[-400:])

        for chunk in ("x = io.read()", 'x = io.stdin:read("l")', "for l in io.lines() do end"):
            out = s.run(chunk, 10)
            check("%s in a chunk raises a clear error on every rank" % chunk,
                  out is not None and any(l.startswith((ALL + " error: ")) and "owns standard input" in l
                                          for l in lines_of(out)),
                  out if out is not None else s.text()[-600:])
            if out is None:
                s.send("\x03")
                s.expect(re.escape(PROMPT), 10)
        out = s.run('local f = io.open(os.getenv("TPSH_EXE") or "/etc/hostname") print(f:read(1) ~= nil) f:close()')
        check("reading a file still works in a chunk", (ALL + " true") in lines_of(out), out)

        s.check_ctrl_d_ends("that session ends with status 0")
    finally:
        s.close()

    # ---- a line longer than TPSH_REPL_LINE_MAX is discarded with a message; the session goes on ---------
    s = Session({"TPSH_REPL_LINE_MAX": "100000"})
    try:
        s.expect(re.escape(PROMPT), 30)
        s.send("x = '" + "c" * 200000 + "'\r")
        ok = s.wait_raw(b"was discarded: longer than 100000 bytes (TPSH_REPL_LINE_MAX)", 20)
        check("a line longer than TPSH_REPL_LINE_MAX is discarded, saying so", ok, repr(s.raw[-400:]))
        s.expect(re.escape(PROMPT), 10)
        s.mark = len(s.text())
        out = s.run("=x")
        check("the session goes on after a line too long, which did not run", (ALL + " nil") in lines_of(out), out)
    finally:
        s.close()

    # ---- the history file is never written through a link, and an unreadable one is kept aside ---------
    # (issue 45: a link's target was rewritten and made 0600; a file not in libedit's format was replaced)
    hdir = os.path.join(TMP, "hist")
    os.mkdir(hdir)
    victim, link, plain = (os.path.join(hdir, n) for n in ("victim", "link", "plain"))
    with open(victim, "w") as f:
        f.write("keep\n")
    os.chmod(victim, 0o644)
    os.symlink(victim, link)
    with open(plain, "w") as f:
        f.write("my notes, not a history\n")
    for path, what in ((link, "link"), (plain, "plain")):
        s = Session({"TPSH_HISTORY": path})
        try:
            s.expect(re.escape(PROMPT), 30)
            s.run("x_history_probe = 1")
            s.send("\x04")
            s.exited(20)
            t = s.text()
        finally:
            s.close()
        if what == "link":
            check("a history file that is a symbolic link is neither followed nor replaced, saying so",
                  "is a symbolic link, which tpsh neither follows nor replaces" in t and os.path.islink(link) and
                  open(victim).read() == "keep\n" and stat.S_IMODE(os.stat(victim).st_mode) == 0o644, t[-600:])
        else:
            aside = plain + ".unreadable"
            kept = open(aside).read() if os.path.exists(aside) else ""
            new_hist = open(plain, errors="replace").read() if os.path.exists(plain) else ""
            check("an unreadable history file is kept aside, not replaced, and a new one begun",
                  ("kept as %s" % aside) in t and kept == "my notes, not a history\n" and "x_history_probe" in new_hist
                  and stat.S_IMODE(os.stat(plain).st_mode) == 0o600, t[-600:])
    check("no temporary history file is left behind", sorted(os.listdir(hdir)) ==
          ["link", "plain", "plain.unreadable", "victim"], repr(os.listdir(hdir)))

    # ---- TPSH_HISTORY set but empty means the default file -------------------------------------------
    home = os.path.join(TMP, "home")
    os.mkdir(home)
    s = Session({"TPSH_HISTORY": "", "HOME": home})
    try:
        s.expect(re.escape(PROMPT), 30)
        s.run("x_history_probe = 1")
        s.send("\x04")
        s.exited(20)
        path = os.path.join(home, ".tpsh_history")
        hist = open(path, errors="replace").read() if os.path.exists(path) else ""
        check("TPSH_HISTORY set but empty saves history in ~/.tpsh_history", "x_history_probe" in hist,
              "exists %s" % os.path.exists(path))
    finally:
        s.close()

    fuzz(int(os.environ.get("TPSH_REPL_FUZZ_SESSIONS", "2")), int(os.environ.get("TPSH_REPL_FUZZ_LINES", "25")),
         fuzz_seed)

    print("%d failed" % len(failures) if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        status = main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(status)
