#!/usr/bin/env python3
"""Drives Debian's headless Chromium through cohortd's dashboard over the DevTools protocol.

Run by dashboard_test (a live coordinator + agent with http_listen and TLS, a command job of
user A reporting metrics). Steps, each bounded by --timeout:
  1. log in as user A (the token typed into the login form);
  2. the jobs page lists the job with its state, owner, age and progress bar;
  3. open the job's page while it runs; the chart's point count (data-points) must grow while the
     job trains and, once the job has ended, equal the number of points `cohort metrics JOB -o
     json` prints; the Chart.js chart itself holds that many points; rank 0's log pane shows the
     job's output; placement, events and spec are shown; a screenshot of the page is saved (the
     test's artefact);
  4. meanwhile `cohort metrics JOB -o json -f`, started before the browser while the job runs, ends
     with the job having printed the whole stored series, reports stored after it started included;
  5. the nodes page shows the node's slots, GPUs and health;
  6. log out, log in as user B: B's jobs page does not list the job, B's job page says there is no
     such job, and B's request for the job's JSON is 404.
TLS stays on: Chromium trusts exactly the coordinator's key, by its SPKI hash
(--ignore-certificate-errors-spki-list), computed here from the certificate with openssl.
Exit 0 when every check passed; otherwise 1 with the reason on stderr.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # Debian's python3-websocket

POLL_S = 0.25


class Failure(Exception):
    pass


def spki_hash(cert_file):
    """base64(sha256(SubjectPublicKeyInfo DER)) of the certificate's key, as Chromium wants it."""
    pubkey = subprocess.run(["openssl", "x509", "-in", cert_file, "-pubkey", "-noout"], check=True,
                            capture_output=True, timeout=30).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pubkey, check=True,
                         capture_output=True, timeout=30).stdout
    digest = subprocess.run(["openssl", "dgst", "-sha256", "-binary"], input=der, check=True,
                            capture_output=True, timeout=30).stdout
    return base64.b64encode(digest).decode()


class Browser:
    """One headless Chromium with one page, spoken to over its DevTools websocket."""

    def __init__(self, chromium, spki, timeout, log_file):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="cohort-chromium-")
        args = [chromium, "--headless=new", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                "--user-data-dir=" + self.profile, "--ignore-certificate-errors-spki-list=" + spki,
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1280,1600", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
        self.log = open(log_file, "wb")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        port = self._devtools_port()
        deadline = time.monotonic() + timeout
        page = None
        while page is None:
            with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=timeout) as answer:
                targets = json.load(answer)
            page = next((t for t in targets if t.get("type") == "page"), None)
            if page is None:
                if time.monotonic() > deadline:
                    raise Failure("Chromium opened no page within %.0f s" % timeout)
                time.sleep(POLL_S)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _devtools_port(self):
        # With port 0 Chromium writes the port it bound to <profile>/DevToolsActivePort.
        path = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Failure("Chromium exited with %s before opening its DevTools port" % self.process.returncode)
            try:
                with open(path) as f:
                    first = f.readline().strip()
                if first:
                    return int(first)
            except FileNotFoundError:
                pass
            time.sleep(POLL_S)
        raise Failure("Chromium did not open its DevTools port within %.0f s" % self.timeout)

    def call(self, method, **params):
        self.next_id += 1
        ident = self.next_id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            message = json.loads(self.ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise Failure("%s: %s" % (method, message["error"]))
                return message.get("result", {})
        raise Failure("%s: no answer within %.0f s" % (method, self.timeout))

    def eval(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise Failure("script %r threw: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def goto(self, url):
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href === %s" % json.dumps(url),
                      "the page %s to load" % url)

    def wait_for(self, expression, what, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        value = None
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(POLL_S)
        raise Failure("timed out after %.0f s waiting for %s (last value %r)" % (timeout or self.timeout, what, value))

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.ws.close()
        except Exception:  # the browser may already be gone
            pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def log_in(browser, base, token, who):
    browser.goto(base + "/login")
    browser.wait_for("!!document.getElementById('token')", "the login form")
    browser.eval("document.getElementById('token').value = %s; document.getElementById('login').click(); true"
                 % json.dumps(token))
    browser.wait_for("location.pathname === '/jobs' && document.getElementById('who').textContent === %s"
                     % json.dumps(who), "the jobs page after logging in as " + who)
    browser.wait_for("document.getElementById('jobs').dataset.count !== undefined", "the jobs list of " + who)


def cli_points(args):
    """The points `cohort metrics JOB -o json` prints (JSON Lines: one object per report)."""
    out = subprocess.run([args.cohort, "--credentials", args.credentials, "--coordinator", args.coordinator,
                          "metrics", args.job, "-o", "json"], capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise Failure("cohort metrics failed (%d): %s%s" % (out.returncode, out.stdout, out.stderr))
    points = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    if any("seq" not in point or "step" not in point for point in points):
        raise Failure("cohort metrics -o json printed something else than metrics points:\n" + out.stdout)
    return points


class Follower:
    """`cohort metrics JOB -o json -f` started while the job runs: it prints the stored history, then
    each new report from the coordinator's watch, and ends by itself with the job."""

    def __init__(self, args):
        self.args = args
        fd, self.path = tempfile.mkstemp(prefix="cohort-metrics-follow-")
        err_fd, self.err_path = tempfile.mkstemp(prefix="cohort-metrics-follow-err-")
        with os.fdopen(fd, "w") as out, os.fdopen(err_fd, "w") as err:
            self.process = subprocess.Popen([args.cohort, "--credentials", args.credentials, "--coordinator",
                                             args.coordinator, "metrics", args.job, "-o", "json", "-f"],
                                            stdout=out, stderr=err, start_new_session=True)
        # Its first line means it has read the history; whatever is stored after that moment reaches it
        # only through the watch. The series' length now bounds what its history read could hold.
        deadline = time.monotonic() + args.timeout
        while not self._text().count("\n"):
            if self.process.poll() is not None:
                raise Failure("cohort metrics -f exited with %s before printing anything: %s"
                              % (self.process.returncode, self._text(self.err_path)))
            if time.monotonic() > deadline:
                raise Failure("cohort metrics -f printed nothing within %.0f s" % args.timeout)
            time.sleep(POLL_S)
        self.stored_at_start = len(cli_points(args))

    def _text(self, path=None):
        with open(path or self.path) as f:
            return f.read()

    def check(self, expected):
        """The follower ended with the job (exit 0) having printed exactly the stored series, in order,
        including reports stored after it started."""
        try:
            code = self.process.wait(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            raise Failure("cohort metrics -f did not end within %.0f s of the job's end" % self.args.timeout)
        text = self._text()
        if code != 0:
            raise Failure("cohort metrics -f exited %d: %s%s" % (code, text, self._text(self.err_path)))
        printed = [json.loads(line)["seq"] for line in text.splitlines() if line.strip()]
        stored = [point["seq"] for point in expected]
        if printed != stored:
            raise Failure("cohort metrics -f printed seqs %r; the stored series is %r" % (printed, stored))
        if self.stored_at_start >= len(stored):
            raise Failure("the job had stored all %d reports before cohort metrics -f started, so following was "
                          "not tested; raise COHORT_DASHBOARD_TEST_STEPS" % len(stored))
        print("dashboard: cohort metrics -f printed all %d reports, %d or more of them live"
              % (len(stored), len(stored) - self.stored_at_start))

    def close(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        os.unlink(self.path)
        os.unlink(self.err_path)


def check(args):
    base = args.url.rstrip("/")
    # Started first, while the job has sent only a few of its reports.
    follower = Follower(args)
    try:
        browser = Browser(args.chromium, spki_hash(args.cert), args.timeout, args.chromium_log)
    except BaseException:
        follower.close()
        raise
    try:
        # 1-2: user A logs in and sees the job in the list.
        log_in(browser, base, args.token, args.user)
        browser.wait_for("!!document.querySelector('#jobs tr[data-job-id=%s]')" % json.dumps(args.job),
                         "job %s in %s's jobs list" % (args.job, args.user))
        # The list's columns for the running job: state, owner, age and a progress bar with its step.
        row = "Array.from(document.querySelector('#jobs tr[data-job-id=%s]').cells).map(c => c.textContent)" % (
            json.dumps(args.job))
        try:
            browser.wait_for("(() => { const c = %s; return c[1] === 'RUNNING' && c[2] === %s && "
                             "/^[0-9]+(s|m[0-9]{2}s)$/.test(c[3]) && "
                             "/^[0-9]+%% \\(step [0-9]+\\/[0-9]+\\)$/.test(c[5].trim()); })()"
                             % (row, json.dumps(args.user)),
                             "the jobs list's state, owner, age and progress of " + args.job)
        except Failure as failure:
            raise Failure("%s; the row's cells: %r" % (failure, browser.eval(row)))
        if not browser.eval("!!document.querySelector('#jobs tr[data-job-id=%s] .progress')" % json.dumps(args.job)):
            raise Failure("the jobs list shows no progress bar for %s: %r" % (args.job, browser.eval(row)))

        # 3: the job's page, live.
        browser.goto(base + "/job?id=" + args.job)
        browser.wait_for("!!document.getElementById('charts') && !document.getElementById('job').hidden",
                         "the job page")
        if browser.eval("typeof window.Chart") != "function":
            raise Failure("Chart.js is not loaded on the job page (%r)" % browser.eval("window.cohortChartMissing"))
        seen = []
        deadline = time.monotonic() + args.job_timeout
        while True:
            page = browser.eval("(() => { const c = document.getElementById('charts');"
                                " return {points: Number(c.dataset.points), state: c.dataset.state || '',"
                                " complete: c.dataset.complete === 'true'}; })()")
            if not seen or seen[-1] != page["points"]:
                seen.append(page["points"])
            if page["complete"]:
                expected = cli_points(args)
                if page["points"] == len(expected):
                    break
                raise Failure("the chart shows %d points after the job ended; cohort metrics -o json prints %d"
                              % (page["points"], len(expected)))
            if time.monotonic() > deadline:
                raise Failure("the job did not end within %.0f s (page: %r)" % (args.job_timeout, page))
            time.sleep(POLL_S)
        follower.check(expected)
        if len([n for n in seen if n > 0]) < 2:
            raise Failure("the chart never updated while the job trained (point counts seen: %r)" % seen)
        chart_points = browser.eval("Chart.getChart('chart-loss').data.datasets[0].data.length")
        if chart_points != page["points"]:
            raise Failure("the loss chart holds %r points; data-points says %r" % (chart_points, page["points"]))
        # The same curve, not only as many points: the steps and losses match the CLI's, in order.
        plotted = browser.eval("Chart.getChart('chart-loss').data.datasets[0].data.map(p => [p.x, p.y])")
        printed = [[p["step"], p["loss"]] for p in expected]
        if any(a[0] != b[0] or abs(a[1] - b[1]) > 1e-9 for a, b in zip(plotted, printed)):
            raise Failure("the loss chart's (step, loss) points %r differ from cohort metrics' %r" % (plotted, printed))
        browser.wait_for("(document.getElementById('log') || {textContent: ''}).textContent"
                         ".includes('dashboard-test step 1 ')",
                         "rank 0's log on the job page")
        # Placement, events and spec of the job.
        browser.wait_for("Array.from(document.querySelectorAll('#job section')).some(s => s.querySelector('h3')"
                         ".textContent === 'Placement' && Array.from(s.querySelectorAll('td')).some(td => "
                         "td.textContent === 'node-a'))", "node-a in the job's placement table")
        events = browser.eval("Array.from(document.querySelectorAll('#job section')).filter(s => s.querySelector('h3')"
                              ".textContent === 'Events').map(s => Array.from(s.querySelectorAll('tbody tr')).map("
                              "r => r.cells[3].textContent))[0] || []")
        if "RUNNING" not in events or "SUCCEEDED" not in events:
            raise Failure("the job's events table does not show RUNNING and SUCCEEDED: %r" % events)
        spec = json.loads(browser.eval("document.getElementById('spec').textContent") or "null")
        if not spec or not any(word.endswith("metrics_job") for word in spec.get("command", [])):
            raise Failure("the job page's spec does not show the job's command: %r" % spec)
        browser.screenshot(args.screenshot)
        print("dashboard: %s's job page showed %d points, as cohort metrics -o json; counts seen while it ran: %r"
              % (args.user, page["points"], seen))

        # The nodes page: the node with its slots, GPUs and health.
        browser.goto(base + "/nodes")
        headers = browser.wait_for("(() => { const t = document.querySelector('#nodes table'); return t && "
                                   "Array.from(t.tHead.rows[0].cells).map(c => c.textContent); })()",
                                   "the nodes table")
        for column in ("Slots", "Free slots", "GPUs", "Health"):
            if column not in headers:
                raise Failure("the nodes table has no %r column: %r" % (column, headers))
        node = browser.wait_for("(() => { const r = Array.from(document.querySelectorAll('#nodes tbody tr'))"
                                ".find(r => r.cells[0].textContent === 'node-a'); return r && "
                                "Array.from(r.cells).map(c => c.textContent); })()", "node-a on the nodes page")
        cell = dict(zip(headers, node))
        if cell["Slots"] != "2" or not cell["Free slots"].isdigit() or not cell["GPUs"] or \
                not cell["Health"].startswith("healthy (lease"):
            raise Failure("node-a's row on the nodes page: %r" % cell)
        print("dashboard: jobs list (state, owner, age, progress), placement, events, spec and nodes page shown")

        # 6: user B sees nothing of it.
        browser.eval("document.getElementById('logout').click(); true")
        browser.wait_for("location.pathname === '/login'", "the login page after logging out")
        log_in(browser, base, args.other_token, args.other_user)
        if browser.eval("!!document.querySelector('#jobs tr[data-job-id=%s]')" % json.dumps(args.job)):
            raise Failure("%s's jobs list shows %s's job %s" % (args.other_user, args.user, args.job))
        if args.job in browser.eval("document.getElementById('app').textContent"):
            raise Failure("%s's jobs page mentions job %s" % (args.other_user, args.job))
        browser.goto(base + "/job?id=" + args.job)
        browser.wait_for("(document.getElementById('job-error') || {textContent: ''}).textContent.includes('no job')",
                         "the 'no job' error on %s's view of the job page" % args.other_user)
        if not browser.eval("document.getElementById('job').hidden"):
            raise Failure("%s's job page shows the job" % args.other_user)
        status = browser.eval("fetch('/api/job?id=%s', {headers: {Authorization: 'Bearer ' + "
                              "sessionStorage.getItem('cohort-token')}}).then(r => r.status)" % args.job)
        if status != 404:
            raise Failure("%s's GET /api/job?id=%s answered %r, not 404" % (args.other_user, args.job, status))
        print("dashboard: %s does not see the job (list, page, API 404)" % args.other_user)
    finally:
        browser.close()
        follower.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="https://127.0.0.1:PORT of the dashboard")
    parser.add_argument("--cert", required=True, help="the coordinator's HTTPS certificate (PEM), trusted by SPKI")
    parser.add_argument("--job", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--token-file", required=True, help="user A's token")
    parser.add_argument("--other-user", required=True)
    parser.add_argument("--other-token-file", required=True, help="user B's token")
    parser.add_argument("--cohort", required=True, help="the cohort CLI")
    parser.add_argument("--credentials", required=True, help="credentials file for cohort metrics")
    parser.add_argument("--coordinator", required=True, help="the coordinator's gRPC address")
    parser.add_argument("--screenshot", required=True, help="where to save the job page's PNG")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromium-log", default=os.devnull)
    parser.add_argument("--timeout", type=float, default=30, help="bound of each step (s)")
    parser.add_argument("--job-timeout", type=float, default=90, help="bound of the job's run (s)")
    args = parser.parse_args()
    with open(args.token_file) as f:
        args.token = f.read().strip()
    with open(args.other_token_file) as f:
        args.other_token = f.read().strip()
    try:
        check(args)
    except Failure as failure:
        print("dashboard_chromium: FAILED: %s" % failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
