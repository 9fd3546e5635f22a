#!/usr/bin/env python3
"""A nemesis for fleet coordination (issue 30): real `policy fetch` processes sharing one session
through a real `redis-server`, against the rotating, revoke-on-reuse token server
(scripts/oauth2-rotating-server.py), under a seeded random schedule of faults, with a checker over
the token server's log.

Faults: kill -9 of a process (any, or the one whose token call is at the server), SIGSTOP/SIGCONT
(shorter and longer than the lease; any process, or the holder), FLUSHALL, a Redis restart with no
persistence, CLIENT PAUSE shorter and longer than the lease, and token endpoint trouble (503, 429
with Retry-After, a slow answer). Tokens expire every few seconds, so a run crosses many expiries.

The checker, per token family (a revocation ends one; the driver then starts a new one, as a user
signing in again would, and counts it):
- refresh tokens presented twice: each is allowed only when it is the documented one: the first
  call presenting that token came from a process that was killed or stopped after the server
  received the call and before it could tell anyone (the checker names it); anything else is a
  violation;
- logouts the server did not ask for: a process logged out while its family had no refused
  refresh token (no invalid_grant answered) is a violation, unless the server refused an access
  token on its first use in that run or the cooldown before it (an expiry between a pair's issue
  and its first use, typically while its process was stopped: the request's own refresh did not
  help, and the policy's `on-exhausted: logout`, SPEC's default, ends the session; counted as
  `logouts_fresh_token_refused`);
- pairs lost: every pair the server issued is presented by the next successful call, and the last
  one is held at the end (a credentials file or Redis); a gap not explained by an allowed reuse is
  a violation.

Usage: fleet-nemesis.py --binary .build/debug/policy [--seed N] [--faults N] [--processes N]
       [--signed] [--out DIR] [--json] [--events]
Exits 0 when the checker finds no violation, 1 otherwise; prints the counts (JSON with --json).
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
# The policy's logout cooldown (seconds): a run started within it after a logout adopts that logout.
COOLDOWN = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


class Redis:
    def __init__(self, port, folder):
        self.port = port
        self.folder = folder
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_listening(self.port):
            raise RuntimeError("redis-server did not start")

    def kill(self):
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process = None

    def command(self, *arguments, timeout=10):
        return subprocess.run(["redis-cli", "-p", str(self.port)] + list(arguments), capture_output=True,
                              text=True, timeout=timeout).stdout.strip()


class TokenServer:
    def __init__(self, folder, expires_in):
        self.log = os.path.join(folder, "token-calls.jsonl")
        self.seed = os.path.join(folder, "seed.json")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "oauth2-rotating-server.py"), "--credentials", self.seed, "--log",
             self.log, "--expires-in", str(expires_in), "--api-delay-ms", "10", "--refresh-delay-ms", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        self.port = int(line.split()[1])

    def request(self, method, path, body=None):
        data = body.encode() if body is not None else None
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), data=data, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read().decode())

    def stats(self):
        return self.request("GET", "/stats")

    def calls(self):
        entries = []
        with open(self.log) as file:
            for line in file:
                entries.append(json.loads(line))
        return entries

    def stop(self):
        self.process.kill()
        self.process.wait()


class Slot:
    """One process slot: `policy fetch` run again and again, each run recorded."""

    def __init__(self, number, driver):
        self.number = number
        self.driver = driver
        self.process = None
        self.runs = []
        self.lock = threading.Lock()
        self.stopping = False
        # Cleared while the driver starts a new family: no run starts with the old one's files.
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        while not self.stopping:
            self.running.wait()
            if self.stopping:
                break
            self.run_once(self.driver.count)

    def idle(self):
        with self.lock:
            return self.process is None

    def run_once(self, count):
        d = self.driver
        arguments = [d.binary, "fetch"] + (["--verbose"] if d.arguments.events else []) + [
            "--policy", d.policy_path(self.number), "--credentials", d.credentials_path(self.number),
            "--count", str(count), "--concurrency", "2", "http://127.0.0.1:%d/api/profile" % d.token.port]
        environment = dict(os.environ, FLEET_KEY="a-fleet-key-of-at-least-thirty-two-bytes-long")
        started = time.time()
        with self.lock:
            if self.stopping and count == d.count:
                return None
            # Checked under the lock the driver's reset reads `idle` with: a thread that passed
            # `running.wait()` just before a reset cleared it starts nothing (else its process
            # would read the old family's files and store while the reset replaces them, and end
            # in the new family with the old one's logout).
            if not self.running.is_set():
                return None
            self.process = subprocess.Popen(arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            env=environment)
            pid = self.process.pid
            # The family this run belongs to: the one it started in (a reset kills every run
            # before it starts the next family, so a run never spans two).
            family = d.family
        out, err = self.process.communicate()
        if d.arguments.events:
            with open(os.path.join(d.folder, "events-%d-%d.jsonl" % (self.number, pid)), "w") as file:
                file.write(err)
        with self.lock:
            code = self.process.returncode
            self.process = None
        run = {"slot": self.number, "pid": pid, "started": started, "ended": time.time(), "status": code,
               "family": family, "summary": (out.strip().splitlines() or [""])[-1], "stderr": err[-2000:],
               "logout_lines": [line for line in out.splitlines() if "logged-out:" in line][:3]}
        self.runs.append(run)
        return run

    def pid(self):
        with self.lock:
            return self.process.pid if self.process else None

    def signal(self, number):
        with self.lock:
            if self.process:
                try:
                    os.kill(self.process.pid, number)
                    return self.process.pid
                except ProcessLookupError:
                    return None
        return None


class Driver:
    def __init__(self, arguments):
        self.arguments = arguments
        self.binary = os.path.abspath(arguments.binary)
        self.random = random.Random(arguments.seed)
        self.folder = arguments.out or tempfile.mkdtemp(prefix="fleet-nemesis-")
        os.makedirs(self.folder, exist_ok=True)
        self.count = arguments.count
        self.lease = 3.0
        self.token = TokenServer(self.folder, arguments.expires_in)
        self.redis = Redis(free_port(), self.folder)
        self.redis.start()
        self.family = 0
        self.faults = []
        self.resets = 0
        self.reset_if_revoked_final = False
        self.slots = [Slot(number, self) for number in range(1, arguments.processes + 1)]
        for slot in self.slots:
            self.write_policy(slot.number)
            shutil.copy(self.token.seed, self.credentials_path(slot.number))

    def policy_path(self, slot):
        return os.path.join(self.folder, "policy-%d.yaml" % slot)

    def credentials_path(self, slot):
        return os.path.join(self.folder, "credentials-%d.json" % slot)

    def write_policy(self, slot):
        signing = ", signing-key-env: FLEET_KEY" if self.arguments.signed else ""
        with open(self.policy_path(slot), "w") as file:
            file.write("""policy: 1
name: nemesis
rules:
  - { name: expired, when: { status: [401] }, then: refresh }
refresh:
  use: oauth2
  with: { token-url: "http://127.0.0.1:%d/token?p=%d", client-id: app }
  timeout: 2s
  limit: { count: 1000, per: 10s }
logout: { cooldown: %ds, cancel-in-flight: true }
coordination: { use: redis, with: { url: "redis://127.0.0.1:%d/0", key: nemesis, lease: 3s, connect-timeout: 500ms%s } }
""" % (self.token.port, slot, COOLDOWN, self.redis.port, signing))

    def note(self, kind, **fields):
        entry = dict(kind=kind, at=time.time(), family=self.family, **fields)
        self.faults.append(entry)
        return entry

    def holder(self):
        callers = self.token.stats().get("in_flight") or []
        return int(callers[0]) if callers and callers[0].isdigit() else None

    def later(self, delay, action):
        timer = threading.Timer(delay, action)
        timer.daemon = True
        timer.start()

    def fault(self):
        kinds = ["kill", "kill-holder", "stop-short", "stop-long", "stop-holder", "flushall", "restart-empty",
                 "pause-short", "pause-long", "token-503", "token-429", "token-slow", "expire"]
        kind = self.random.choice(kinds)
        slot = self.random.choice(self.slots)
        if kind in ("kill-holder", "stop-holder"):
            # The holder's call at the server: a slow answer first, so there is one to hit.
            self.token.request("POST", "/fault", "delay_ms=800")
            self.token.request("POST", "/expire", "")
            deadline = time.time() + 3
            holder = None
            while time.time() < deadline and holder is None:
                holder = self.holder()
                time.sleep(0.01)
            if holder is None:
                self.note(kind, skipped="no call in flight")
                return
            slot = self.slots[holder - 1]
        if kind in ("kill", "kill-holder"):
            pid = slot.signal(signal.SIGKILL)
            self.note(kind, slot=slot.number, pid=pid)
        elif kind.startswith("stop"):
            span = self.lease * (0.5 if kind == "stop-short" else 1.4)
            pid = slot.signal(signal.SIGSTOP)
            self.note(kind, slot=slot.number, pid=pid, span=span)
            if pid:
                self.later(span, lambda: slot.signal(signal.SIGCONT))
        elif kind == "flushall":
            self.redis.command("FLUSHALL")
            self.note(kind)
        elif kind == "restart-empty":
            self.redis.kill()
            self.redis.start()
            self.note(kind)
        elif kind.startswith("pause"):
            span = int(self.lease * 1000 * (0.5 if kind == "pause-short" else 1.5))
            self.redis.command("CLIENT", "PAUSE", str(span), "ALL")
            self.note(kind, span=span)
        elif kind == "token-503":
            self.token.request("POST", "/fault", "status=503&count=2")
            self.note(kind)
        elif kind == "token-429":
            self.token.request("POST", "/fault", "status=429&retry_after=1&count=1")
            self.note(kind)
        elif kind == "token-slow":
            self.token.request("POST", "/fault", "delay_ms=1500&count=1")
            self.note(kind)
        else:
            self.token.request("POST", "/expire", "")
            self.note(kind)

    def reset_if_revoked(self):
        """After a revocation (the documented reuse), a new family: every process stopped, a new
        sign-in (credentials files and Redis), and the processes started again."""
        if not self.token.stats().get("revoked"):
            return
        for slot in self.slots:
            slot.running.clear()
        deadline = time.time() + 30
        while not all(slot.idle() for slot in self.slots) and time.time() < deadline:
            for slot in self.slots:
                slot.signal(signal.SIGCONT)
                slot.signal(signal.SIGKILL)
            time.sleep(0.05)
        self.redis.command("CLIENT", "UNPAUSE")
        self.redis.command("FLUSHALL")
        self.token.request("POST", "/reset", "")
        self.family += 1
        self.resets += 1
        for slot in self.slots:
            shutil.copy(self.token.seed, self.credentials_path(slot.number))
        self.note("reset")
        for slot in self.slots:
            slot.running.set()

    def run(self):
        for slot in self.slots:
            slot.thread.start()
        time.sleep(1.5)
        done = 0
        while done < self.arguments.faults:
            time.sleep(self.random.uniform(0.4, 1.2))
            self.reset_if_revoked()
            self.fault()
            done += 1
        # Quiet: every stopped process goes on, the store answers, and the runs in progress end.
        time.sleep(self.lease * 1.6)
        for slot in self.slots:
            slot.signal(signal.SIGCONT)
        self.redis.command("CLIENT", "UNPAUSE")
        for slot in self.slots:
            slot.stopping = True
            slot.running.set()
        for slot in self.slots:
            slot.thread.join(timeout=120)
        self.reset_if_revoked_final = self.token.stats().get("revoked")
        # A last expiry, healthy: each process refreshes (or adopts) from what the fleet holds.
        if not self.reset_if_revoked_final:
            self.token.request("POST", "/expire", "")
            for slot in self.slots:
                slot.run_once(5)

    def stop(self):
        for slot in self.slots:
            slot.signal(signal.SIGCONT)
            slot.signal(signal.SIGKILL)
        self.redis.kill()
        self.token.stop()


def check(driver):
    entries = driver.token.calls()
    calls = [c for c in entries if c.get("event") == "token"]
    runs = [run for slot in driver.slots for run in slot.runs]
    pids = {}  # pid -> slot, from the runs
    for run in runs:
        pids[run["pid"]] = run["slot"]
    report = {"faults": len(driver.faults), "fault_kinds": {}, "families": driver.family + 1, "resets": driver.resets,
              "token_calls": len(calls), "pairs": 0, "expiries": 0, "runs": len(runs), "reuses": 0,
              "reused_tokens": 0,
              "allowed_reuses": [], "violations": [], "logouts": 0, "logouts_asked": 0,
              "logouts_fresh_token_refused": 0}
    for fault in driver.faults:
        report["fault_kinds"][fault["kind"]] = report["fault_kinds"].get(fault["kind"], 0) + 1
    by_family = {}
    for call in calls:
        by_family.setdefault(call.get("family", 0), []).append(call)
    lost_explained = set()
    for family, family_calls in by_family.items():
        family_calls.sort(key=lambda c: c["arrived"])
        ok = [c for c in family_calls if c.get("result") == "ok"]
        report["pairs"] += len(ok)
        first_presentation = {}
        for call in family_calls:
            token = call.get("presented")
            if call.get("result") == "ok" and token not in first_presentation:
                first_presentation[token] = call
        reused = set()
        for call in family_calls:
            if call.get("result") != "reuse":
                continue
            report["reuses"] += 1
            if call.get("presented") in reused:
                # The same spent token again (another process that had not heard the family was
                # revoked): the same reuse, counted once.
                continue
            reused.add(call.get("presented"))
            report["reused_tokens"] += 1
            first = first_presentation.get(call.get("presented"))
            explained = None
            if first:
                slot = int(first["caller"]) if str(first.get("caller", "")).isdigit() else None
                for fault in driver.faults:
                    if fault.get("slot") != slot or fault["kind"] not in (
                            "kill", "kill-holder", "stop-short", "stop-long", "stop-holder"):
                        continue
                    # After the server received the call, before its process could tell anyone.
                    if first["arrived"] - 0.05 <= fault["at"] <= first["answered"] + 1.0:
                        explained = fault
                        break
            if explained:
                lost_explained.add(first.get("issued"))
                report["allowed_reuses"].append(
                    "token %s presented again by process %s: its first call (process %s, at %.3f) was answered "
                    "at %.3f and the process was %s at %.3f, after the server received the call, before it could "
                    "tell anyone (the documented reuse)" % (
                        call["presented"], call["caller"], first["caller"], first["arrived"], first["answered"],
                        "killed" if explained["kind"].startswith("kill") else "stopped", explained["at"]))
            else:
                report["violations"].append("unexplained reuse: %s" % json.dumps(call))
        # Pairs lost: each pair's refresh token is presented by the next successful call.
        for earlier, later in zip(ok, ok[1:]):
            if later.get("presented") != earlier.get("issued") and earlier.get("issued") not in lost_explained:
                report["violations"].append(
                    "pair lost: %s was issued, the next successful call presented %s" % (
                        earlier.get("issued"), later.get("presented")))
    # The last pair of the last family is held by someone.
    last_family = by_family.get(driver.family, [])
    last_ok = [c for c in sorted(last_family, key=lambda c: c["arrived"]) if c.get("result") == "ok"]
    if last_ok and not driver.reset_if_revoked_final:
        last = last_ok[-1]["issued"]
        held = any(last in open(driver.credentials_path(slot.number)).read() for slot in driver.slots)
        if not held:
            report["violations"].append("the last pair (%s) is held by no process" % last)
    # Logouts: asked by the server only when its family had a refused refresh token, or when the
    # server refused an access token it had just issued (an /expire between the pair's issue and
    # its first use: the request's own refresh did not help, and `on-exhausted: logout`, the
    # policy's default, ends the session, as SPEC says), in the run or in the cooldown before it.
    refused_families = {c.get("family", 0) for c in calls if c.get("result") in ("reuse", "refused", "revoked")}
    fresh_refusals = [e for e in entries if e.get("event") == "access-refused-fresh"]
    for run in runs:
        summary = run["summary"]
        logouts = 0
        if " logout" in summary:
            try:
                logouts = int(summary.split(" logout")[0].split(", ")[-1])
            except ValueError:
                logouts = 0
        report["logouts"] += logouts
        if logouts:
            if run["family"] in refused_families:
                report["logouts_asked"] += logouts
            elif any(e.get("family", 0) == run["family"] and run["started"] - COOLDOWN - 1 <= e["at"] <= run["ended"]
                     for e in fresh_refusals):
                report["logouts_fresh_token_refused"] += logouts
            else:
                report["violations"].append(
                    "a logout the server did not ask for (process %d, pid %d): %s %s" % (
                        run["slot"], run["pid"], summary, run["logout_lines"]))
        if "could not be published" in run["stderr"]:
            report.setdefault("unpublished_named", 0)
            report["unpublished_named"] += 1
    report["expiries"] = report["pairs"]
    # The raw material, for a failure's story: every run and every fault, in the run's folder.
    with open(os.path.join(driver.folder, "runs.json"), "w") as file:
        json.dump({"runs": runs, "faults": driver.faults}, file, indent=1)
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=24)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--expires-in", type=int, default=4)
    parser.add_argument("--signed", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--events", action="store_true",
                        help="run each process with --verbose and keep its events in the folder")
    arguments = parser.parse_args()
    driver = Driver(arguments)
    try:
        driver.run()
        report = check(driver)
    finally:
        driver.stop()
    report["seed"] = arguments.seed
    report["folder"] = driver.folder
    if arguments.json:
        print(json.dumps(report, indent=2))
    else:
        print("seed %d: %d faults %s, %d token calls, %d pairs (expiries), %d runs, %d families" % (
            arguments.seed, report["faults"], report["fault_kinds"], report["token_calls"], report["pairs"],
            report["runs"], report["families"]))
        print("reuses: %d presentations of %d spent tokens (%d the documented one), logouts: %d (%d asked by the "
              "server), violations: %d" % (
                  report["reuses"], report["reused_tokens"], len(report["allowed_reuses"]), report["logouts"],
                  report["logouts_asked"], len(report["violations"])))
        for line in report["allowed_reuses"]:
            print("  allowed: " + line)
        for line in report["violations"]:
            print("  VIOLATION: " + line)
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
