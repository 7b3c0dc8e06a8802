// cohort's dashboard: one script for every page; the view comes from location.pathname.
// The token lives in this tab's sessionStorage and goes out only as an Authorization header on
// /api requests. Data is written with textContent, never as HTML. Live views poll every second.
'use strict';

const TOKEN_KEY = 'cohort-token';
const NEXT_KEY = 'cohort-next';
const POLL_MS = 1000;
const LOG_POLL_MS = 2000;
const FINAL_STATES = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

const app = document.getElementById('app');

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child));
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function goToLogin() {
  sessionStorage.removeItem(TOKEN_KEY);
  if (location.pathname !== '/login') {
    sessionStorage.setItem(NEXT_KEY, location.pathname + location.search);
    location.assign('/login');
  }
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// GET an /api endpoint as the logged-in user. 401 sends the user back to the login page.
async function api(path, withToken) {
  const response = await fetch(path, {
    headers: { 'Authorization': 'Bearer ' + (withToken || token()) },
    cache: 'no-store',
    credentials: 'omit',
  });
  if (response.status === 401 && !withToken) {
    goToLogin();
    throw new ApiError(401, 'not logged in');
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new ApiError(response.status, (body && body.error) || response.statusText);
  return body;
}

function millis(timestamp) { return timestamp ? Date.parse(timestamp) : 0; }

function age(fromMs, nowMs) {
  if (!fromMs) return '';
  let s = Math.max(0, Math.round((nowMs - fromMs) / 1000));
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60); s %= 60;
  if (m < 60) return m + 'm' + String(s).padStart(2, '0') + 's';
  const h = Math.floor(m / 60);
  if (h < 48) return h + 'h' + String(m % 60).padStart(2, '0') + 'm';
  return Math.floor(h / 24) + 'd';
}

function progress(metrics) {
  const step = Number((metrics && metrics.step) || 0);
  const total = Number((metrics && metrics.total_steps) || 0);
  const cell = el('span');
  if (total > 0) {
    const bar = el('div', { class: 'progress' }, el('div'));
    const pct = Math.min(100, (100 * step) / total);
    bar.firstChild.style.width = pct.toFixed(1) + '%';
    cell.append(bar, ' ' + pct.toFixed(0) + '% (step ' + step + '/' + total + ')');
  } else if (step > 0) {
    cell.append('step ' + step);
  }
  return cell;
}

function stateCell(state) { return el('span', { class: 'state state-' + state, text: state }); }

function showBanner(text) {
  const banner = document.getElementById('banner');
  banner.textContent = text;
  banner.hidden = false;
}

// Runs `step` now and then every `ms` until it returns false; errors are shown in `errorNode`.
function poll(step, ms, errorNode) {
  let stopped = false;
  const run = async () => {
    if (stopped) return;
    let again = true;
    try {
      again = (await step()) !== false;
      if (errorNode) errorNode.textContent = '';
    } catch (e) {
      if (e.status === 401) return;
      if (errorNode) errorNode.textContent = e.message;
      again = !(e.status === 404 || e.status === 403);
    }
    if (again) setTimeout(run, ms);
  };
  run();
  return () => { stopped = true; };
}

// ---- login ----

function loginView() {
  const input = el('input', { id: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false',
                              placeholder: 'token from your credentials file' });
  const message = el('p', { id: 'login-error', class: 'error' });
  const form = el('form', { id: 'login-form', class: 'login' },
                  el('h2', { text: 'Log in' }),
                  el('label', { for: 'token', text: 'Your cohort token (the token: line of your credentials file)' }),
                  input, el('button', { id: 'login', type: 'submit', text: 'Log in' }), message);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const candidate = input.value.trim();
    if (!candidate) { message.textContent = 'Paste your token first.'; return; }
    try {
      await api('/api/whoami', candidate);
      sessionStorage.setItem(TOKEN_KEY, candidate);
      const next = sessionStorage.getItem(NEXT_KEY) || '/jobs';
      sessionStorage.removeItem(NEXT_KEY);
      location.assign(next.startsWith('/') && !next.startsWith('//') ? next : '/jobs');
    } catch (e) {
      message.textContent = e.status === 401 ? 'That token is not valid here (unknown or revoked).' : e.message;
    }
  });
  app.replaceChildren(form);
  input.focus();
}

// ---- jobs ----

function jobsView() {
  const table = el('table', { id: 'jobs' },
                   el('thead', {}, el('tr', {}, ...['Job', 'State', 'Owner', 'Age', 'Attempt', 'Progress', 'Reason']
                                                     .map((h) => el('th', { text: h })))),
                   el('tbody'));
  const errors = el('p', { class: 'error' });
  const empty = el('p', { class: 'muted', text: 'No jobs yet.' });
  app.replaceChildren(el('h2', { text: 'Jobs' }), errors, table, empty);
  poll(async () => {
    const data = await api('/api/jobs');
    const rows = data.jobs.map((job) => el('tr', { 'data-job-id': job.id },
        el('td', {}, el('a', { href: '/job?id=' + encodeURIComponent(job.id), text: job.id })),
        el('td', {}, stateCell(job.state)),
        el('td', { text: job.owner }),
        el('td', { text: age(millis(job.submit_time), data.now_unix_ms) }),
        el('td', { text: job.attempt }),
        el('td', {}, progress(job.last_metrics)),
        el('td', { class: 'muted', text: job.reason || job.waiting_for || '' })));
    table.tBodies[0].replaceChildren(...rows);
    table.dataset.count = String(rows.length);
    empty.hidden = rows.length > 0;
  }, POLL_MS, errors);
}

// ---- one job ----

function lineChart(canvas, label, color) {
  if (!window.Chart) return null;
  return new window.Chart(canvas, {
    type: 'line',
    data: { datasets: [{ label, data: [], borderColor: color, backgroundColor: color, pointRadius: 2,
                         borderWidth: 1.5, parsing: false }] },
    options: {
      animation: false, maintainAspectRatio: false, normalized: true,
      scales: { x: { type: 'linear', title: { display: true, text: 'step' } } },
      plugins: { legend: { display: true } },
    },
  });
}

function table(headers, rows) {
  return el('table', {}, el('thead', {}, el('tr', {}, ...headers.map((h) => el('th', { text: h })))),
            el('tbody', {}, ...rows.map((cells) => el('tr', {}, ...cells.map((c) => el('td', { text: c }))))));
}

function jobView() {
  const id = new URLSearchParams(location.search).get('id') || '';
  const title = el('h2', { text: 'Job ' + id });
  const errors = el('p', { id: 'job-error', class: 'error' });
  const summary = el('p', { id: 'summary' });
  const charts = el('div', { id: 'charts', class: 'charts', 'data-points': '0' });
  const canvases = {
    loss: el('canvas', { id: 'chart-loss' }),
    accuracy: el('canvas', { id: 'chart-accuracy' }),
    throughput: el('canvas', { id: 'chart-throughput' }),
    commWait: el('canvas', { id: 'chart-comm-wait' }),
  };
  for (const canvas of Object.values(canvases)) charts.append(el('div', { class: 'chart' }, canvas));
  const placement = el('div');
  const events = el('div');
  const spec = el('pre', { id: 'spec' });
  const tabs = el('div', { class: 'tabs' });
  const log = el('pre', { id: 'log', text: '' });
  const logError = el('p', { class: 'error' });
  const body = el('div', { id: 'job', hidden: '' },
                  summary,
                  el('section', {}, el('h3', { text: 'Training curves' }), charts),
                  el('section', {}, el('h3', { text: 'Placement' }), placement),
                  el('section', {}, el('h3', { text: 'Events' }), events),
                  el('section', {}, el('h3', { text: 'Logs' }), tabs, logError, log),
                  el('section', {}, el('h3', { text: 'Spec' }), spec));
  app.replaceChildren(title, errors, body);
  if (window.cohortChartMissing) showBanner(window.cohortChartMissing);

  const series = {
    loss: lineChart(canvases.loss, 'loss', '#c62828'),
    accuracy: lineChart(canvases.accuracy, 'accuracy', '#2e7d32'),
    throughput: lineChart(canvases.throughput, 'samples/s', '#1565c0'),
    // The reporting rank's share of wall time blocked in collectives since its previous report:
    // a rising curve is a slow peer or the network holding training back.
    commWait: lineChart(canvases.commWait, 'communication wait %', '#6a1b9a'),
  };
  let points = 0;
  let afterSeq = 0;
  let finalLoads = 0;
  let state = '';
  let rank = 0;
  let worldSize = 0;
  let stopLogs = null;

  function addPoints(list) {
    for (const point of list) {
      const m = point.metrics || {};
      const x = Number(m.step || 0);
      if (series.loss) series.loss.data.datasets[0].data.push({ x, y: Number(m.loss || 0) });
      if (series.accuracy) series.accuracy.data.datasets[0].data.push({ x, y: Number(m.accuracy || 0) });
      if (series.throughput) series.throughput.data.datasets[0].data.push({ x, y: Number(m.samples_per_s || 0) });
      if (series.commWait) series.commWait.data.datasets[0].data.push({ x, y: 100 * Number(m.comm_wait_ratio || 0) });
      afterSeq = Math.max(afterSeq, Number(point.seq));
      points += 1;
    }
    if (list.length) for (const chart of Object.values(series)) if (chart) chart.update('none');
    // What tests and scripts read: the number of metric reports plotted (each curve has one per report).
    charts.dataset.points = String(points);
  }

  function showLogs(newRank) {
    rank = newRank;
    for (const button of tabs.children) button.classList.toggle('active', Number(button.dataset.rank) === rank);
    if (stopLogs) stopLogs();
    stopLogs = poll(async () => {
      const data = await api('/api/logs?id=' + encodeURIComponent(id) + '&rank=' + rank);
      log.textContent = data.text || '';
      logError.textContent = data.error || '';
      return !FINAL_STATES.has(state);
    }, LOG_POLL_MS, logError);
  }

  poll(async () => {
    const data = await api('/api/job?id=' + encodeURIComponent(id));
    const job = data.job;
    body.hidden = false;
    state = job.state;
    charts.dataset.state = state;
    summary.replaceChildren(stateCell(job.state), '  owner ' + job.owner + ' · attempt ' + job.attempt +
                            ' · submitted ' + age(millis(job.submit_time), data.now_unix_ms) + ' ago  ',
                            progress(job.last_metrics), el('div', { class: 'muted', text: job.reason || job.waiting_for || '' }));
    const nodes = (job.placement && job.placement.nodes) || [];
    placement.replaceChildren(nodes.length ? table(['Node', 'Address', 'Node rank', 'Ranks', 'GPUs'],
        nodes.map((n) => [n.node_id, n.address, n.node_rank,
                          n.num_ranks > 1 ? n.first_rank + '–' + (n.first_rank + n.num_ranks - 1) : n.first_rank,
                          (n.gpus || []).join(',') || '-']))
        : el('p', { class: 'muted', text: 'Not placed yet.' }));
    events.replaceChildren(table(['Time', 'Attempt', 'From', 'To', 'Reason'], data.events.map((e) => [
        new Date(millis(e.time)).toLocaleTimeString(), e.state_change.attempt, e.state_change.from,
        e.state_change.to, e.state_change.reason])));
    if (!spec.textContent) spec.textContent = JSON.stringify(job.spec, null, 2);
    const size = Number((job.placement && job.placement.world_size) || 0);
    if (size !== worldSize && data.logs_available) {
      worldSize = size;
      tabs.replaceChildren(...Array.from({ length: size }, (_, r) => {
        const button = el('button', { type: 'button', 'data-rank': r, text: 'rank ' + r });
        button.addEventListener('click', () => showLogs(r));
        return button;
      }));
      if (size > 0) showLogs(Math.min(rank, size - 1));
    }
    // Every report since the last one shown, in pages.
    for (;;) {
      const page = await api('/api/metrics?id=' + encodeURIComponent(id) + '&after_seq=' + afterSeq);
      addPoints(page.metrics.points || []);
      if (!page.more) break;
    }
    if (FINAL_STATES.has(state)) {
      // One more round after the end, for reports that landed with the final state; then stop.
      finalLoads += 1;
      if (finalLoads > 1) { charts.dataset.complete = 'true'; return false; }
    }
    return true;
  }, POLL_MS, errors);
}

// ---- nodes ----

function nodesView() {
  const errors = el('p', { class: 'error' });
  const holder = el('div', { id: 'nodes' });
  app.replaceChildren(el('h2', { text: 'Nodes' }), errors, holder);
  poll(async () => {
    const data = await api('/api/nodes');
    const nodes = (data.nodes && data.nodes.nodes) || [];
    holder.replaceChildren(nodes.length ? table(['Node', 'Host', 'Address', 'Slots', 'Free slots', 'GPUs', 'Free GPUs',
                                                 'Cores', 'Memory', 'Health'],
        nodes.map((s) => {
          const n = s.node;
          const gpus = (n.gpus || []).map((g) => g.index + ': ' + g.model).join(', ') || 'none';
          const lease = Number(s.lease_remaining_ms || 0);
          // Why a node takes no new work (cohort nodes' STATE): suspect, draining, or restored from etcd.
          const state = s.suspect_reason ? 'suspect: ' + s.suspect_reason
            : s.draining ? 'draining'
            : s.awaiting_registration ? 'restored, waiting for its agent to register' : 'healthy';
          const health = lease > 0 ? state + ' (lease ' + (lease / 1000).toFixed(1) + ' s left)' : 'lease expired';
          return [n.node_id, n.hostname, n.address, n.slots, n.free_slots, gpus, (s.free_gpus || []).join(',') || '-',
                  n.cores, (Number(n.memory_bytes) / 2 ** 30).toFixed(1) + ' GiB', health];
        }))
        : el('p', { class: 'muted', text: 'No live nodes.' }));
  }, POLL_MS, errors);
}

// ---- start ----

async function main() {
  const path = location.pathname;
  if (path === '/login') return loginView();
  if (!token()) return goToLogin();
  const nav = document.getElementById('nav');
  nav.hidden = false;
  document.getElementById('logout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.assign('/login');
  });
  try {
    const me = await api('/api/whoami');
    document.getElementById('who').textContent = me.name + (me.admin ? ' (admin)' : '');
  } catch (e) {
    return;
  }
  if (path === '/job') return jobView();
  if (path === '/nodes') return nodesView();
  return jobsView();
}

main();
