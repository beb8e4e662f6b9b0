/**
 * svctrace's dashboard: connects to /v1/events on the server that served the
 * page, decodes protobuf with the same generated code as the CLI, keeps a
 * capped store, and renders on animation frames only when something changed.
 */
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import './style.css';
import { svctrace } from '../gen/svctrace';
import { SvctraceClient, WebSocketCtor } from '../client/client';
import { Store, FlowView } from './store';
import { hops } from './path-view';

import pb = svctrace.v1;

const store = new Store();
let client: SvctraceClient | null = null;
let paused = false;
let selected: string | null = null;
let filterText = '';
let nodeFilter = '';
let chart: uPlot | null = null;
let chartService = '';
let chartSeriesKey = '';
let retryMs = 500;

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

function esc(s: unknown): string {
  return String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

function streamUrl(): string {
  return `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/v1/events`;
}

function token(): string | undefined {
  return sessionStorage.getItem('svctrace-token') || undefined;
}

async function connect(): Promise<void> {
  store.connectionNote = 'connecting';
  store.dirty = true;
  try {
    client = await SvctraceClient.connect(
      { url: streamUrl(), token: token(), flows: true, filter: {}, WebSocket: WebSocket as unknown as WebSocketCtor },
      {
        events: (events) => {
          if (!paused) store.addEvents(events);
        },
        flows: (flows) => {
          if (!paused) store.addFlows(flows);
        },
        status: (s) => {
          store.status = s;
          store.dirty = true;
        },
        diagnosis: (d) => store.addDiagnosis(d),
        error: (e) => {
          store.connectionNote = `server: ${e.code} ${e.message}`;
          store.dirty = true;
        },
        close: () => {
          store.connected = false;
          store.connectionNote = 'reconnecting';
          store.dirty = true;
          client = null;
          setTimeout(() => void connect(), retryMs);
          retryMs = Math.min(retryMs * 2, 5000);
        },
      },
    );
    store.setHello(client.hello ?? {});
    store.connected = true;
    store.connectionNote = 'connected';
    retryMs = 500;
    store.dirty = true;
  } catch {
    store.connected = false;
    store.connectionNote = token() ? 'cannot connect (retrying)' : 'cannot connect (retrying; if the server needs a token, enter it above)';
    store.dirty = true;
    setTimeout(() => void connect(), retryMs);
    retryMs = Math.min(retryMs * 2, 5000);
  }
}

function flowMatches(f: FlowView): boolean {
  if (nodeFilter && f.node !== nodeFilter) return false;
  if (!filterText) return true;
  const hay = `${f.node} ${f.service} ${f.client} ${f.backend} ${f.backendNetns} ${f.seenByBackend} ${f.state} ${f.drops.join(' ')}`.toLowerCase();
  return filterText
    .toLowerCase()
    .split(/\s+/)
    .every((w) => hay.includes(w));
}

function renderFlows(): void {
  const rows = [...store.flows.values()].filter(flowMatches).sort((a, b) => b.seq - a.seq).slice(0, 300);
  $('flow-count').textContent = `${store.flows.size} flows`;
  $('flows-body').innerHTML = rows
    .map(
      (f) => `<tr data-flow="${esc(f.key)}" data-testid="flow-row" class="${f.key === selected ? 'sel' : ''} ${f.drops.length || f.reset ? 'bad' : ''}">
<td>${esc(f.id)}</td><td data-testid="flow-node">${esc(f.node)}</td><td>${esc(f.service)}</td><td>${esc(f.client)}</td><td title="what the pod sees">${esc(f.seenByBackend)}</td>
<td data-testid="flow-backend">${esc(f.backend || '—')}</td><td>${esc(f.backendNetns)}</td><td>${esc(f.closed ? 'closed' : f.state)}${f.reset ? ' RST' : ''}${f.synsResent ? ` <span title="SYNs the client sent again before any answer (not in the packet counts)">SYN resent ×${f.synsResent}</span>` : ''}${f.drops.length ? ` drop:${esc(f.drops.join(','))}` : ''}${f.countedOnly ? ' <span title="over the detail budget (--detail-rate): counted, no hook or device events">counted only</span>' : ''}</td>
<td>${(Number(f.lastTsNs - f.firstTsNs) / 1e6).toFixed(1)} ms</td><td>${f.packets[0]}/${f.bytes[0]}</td><td>${f.packets[1]}/${f.bytes[1]}</td></tr>`,
    )
    .join('');
}

function renderPath(): void {
  const f = selected ? store.flows.get(selected) : undefined;
  const el = $('path');
  if (!f) {
    el.innerHTML = '<p class="muted">Click a flow to see its path through the kernel.</p>';
    return;
  }
  el.innerHTML =
    `<h3>flow ${esc(f.id)}: ${esc(f.client)} → ${esc(f.service)}</h3><ol class="hops" data-testid="path-hops">` +
    hops(f)
      .map(
        (h) => `<li class="hop ${h.drop ? 'drop' : ''} st-${esc(h.stage)}" data-testid="hop" data-stage="${esc(h.stage)}">
<span class="dt">+${h.deltaMs.toFixed(3)} ms</span><b>${esc(h.title)}</b><span class="detail">${esc(h.detail)}</span></li>`,
      )
      .join('') +
    '</ol>';
}

function renderDistribution(): void {
  const services = [...store.distribution.keys()];
  const sel = $<HTMLSelectElement>('dist-service');
  if (sel.options.length !== services.length) {
    sel.innerHTML = services.map((s) => `<option>${esc(s)}</option>`).join('');
    if (!chartService && services[0]) chartService = services[0];
    sel.value = chartService;
  }
  const dist = store.distribution.get(chartService);
  if (!dist) return;
  // Backends the rules name but that got nothing yet are shown too: that is the complaint.
  for (const b of store.ruleBackends(chartService)) if (!dist.has(b)) dist.set(b, { flows: 0, bytes: 0, perSecond: new Map() });
  const backends = [...dist.keys()].sort();
  const total = backends.reduce((n, b) => n + dist.get(b)!.flows, 0);
  const affinity = store.affinity(chartService);
  $('dist-note').textContent = affinity
    ? `sessionAffinity: ClientIP (${affinity} s): each client sticks to one backend`
    : store.hello?.rules?.length
      ? 'expected: the probability kube-proxy\'s rules give each backend; open: long-lived connections still pinned to it'
      : '';
  $('dist-table').innerHTML =
    backends
      .map((b) => {
        const s = dist.get(b)!;
        const exp = store.expected(chartService, b);
        return `<tr data-testid="dist-row" data-backend="${esc(b)}"><td>${esc(b)}</td><td data-testid="dist-count">${s.flows}</td><td>${total ? ((100 * s.flows) / total).toFixed(1) : 0}%</td><td data-testid="dist-expected">${exp === undefined ? '—' : `${(100 * exp).toFixed(1)}%`}</td><td>${store.openFlows(chartService, b)}</td><td>${s.bytes}</td></tr>`;
      })
      .join('') + `<tr class="total"><td>total</td><td data-testid="dist-total">${total}</td><td></td><td></td><td></td><td></td></tr>`;
  // Time series: new flows per second per backend over the last 5 minutes.
  const now = Math.floor(Date.now() / 1000);
  const xs: number[] = [];
  for (let t = now - 299; t <= now; t++) xs.push(t);
  const data: uPlot.AlignedData = [xs, ...backends.map((b) => xs.map((t) => dist.get(b)!.perSecond.get(t) ?? 0))];
  const key = `${chartService}|${backends.join(',')}`;
  if (!chart || key !== chartSeriesKey) {
    chart?.destroy();
    chartSeriesKey = key;
    const colors = ['#2b8a3e', '#1971c2', '#e8590c', '#9c36b5', '#c2255c', '#0c8599', '#5c940d'];
    chart = new uPlot(
      {
        width: $('dist-chart').clientWidth || 600,
        height: 180,
        series: [{}, ...backends.map((b, i) => ({ label: b, stroke: colors[i % colors.length], width: 2 }))],
        axes: [{}, { label: 'new flows/s' }],
      },
      data,
      $('dist-chart'),
    );
  } else {
    chart.setData(data);
  }
}

function renderHealth(): void {
  const s = store.status;
  const conn = $('conn-status');
  conn.textContent = store.connectionNote;
  conn.className = store.connected ? 'ok' : 'warn';
  conn.dataset.state = store.connected ? 'connected' : 'disconnected';
  $('replay-badge').hidden = !store.hello?.replay;
  $('node').textContent = store.hello
    ? `${store.hello.node} · svctrace ${store.hello.serverVersion}${store.hello.attachBackend ? ` (${store.hello.attachBackend.split(':')[0]})` : ''} · ${store.hello.services?.join(', ')}`
    : '';
  // The nodes (a relay's node servers, with their state), and the node filter's choices.
  const nodes = store.nodes();
  $('nodes').innerHTML = nodes.length > 1 ? nodes.map((n) => `<span class="node ${n.state === 'connected' ? 'ok' : 'warn'}" data-testid="node-state" data-node="${esc(n.node)}" title="${esc(n.url)}${n.error ? `: ${esc(n.error)}` : ''}">${esc(n.node || n.url)} ${esc(n.state)}</span>`).join(' ') : '';
  const sel = $<HTMLSelectElement>('node-filter');
  const names = nodes.map((n) => n.node ?? '').filter(Boolean);
  if (sel.options.length !== names.length + 1) {
    sel.innerHTML = '<option value="">all nodes</option>' + names.map((n) => `<option>${esc(n)}</option>`).join('');
    sel.value = nodeFilter;
  }
  $('h-rate').textContent = s ? Number(s.eventsPerSecond ?? 0).toFixed(0) : '—';
  $('h-received').textContent = String(store.eventsReceived);
  const byStage = store.lossesByStage();
  $('h-lost').textContent = s ? `${String(s.kernelLost ?? 0)}${byStage ? ` (${byStage})` : ''}` : '—';
  // Events and flow updates this tab missed by reading too slowly (a flow's next update repairs its row).
  const flowUpdatesMissed = Number(s?.flowUpdatesDropped ?? 0);
  $('h-dropped').textContent = s ? `${String(s.dropped ?? 0)}${flowUpdatesMissed ? ` (+${flowUpdatesMissed} flow updates)` : ''}` : '—';
  const drops = Object.entries(s?.dropsByReason ?? {});
  // Drops reported by reason (a flow's repeats at one place once), and the kernel's count of the packets.
  const packets = Number(s?.packetsDropped ?? 0);
  $('h-drops').textContent = (drops.length ? drops.map(([r, n]) => `${r}=${String(n)}`).join(' ') : 'none') + (packets ? ` (${packets} packets)` : '');
  $('diagnoses').innerHTML = store.diagnoses
    .map((d) => `<li class="diag ${esc(d.severity)}" data-testid="diagnosis" data-code="${esc(d.code)}">${d.node ? `[${esc(d.node)}] ` : ''}<b>${esc(d.code)}</b>${d.layer ? ` <i>(${esc(d.layer)})</i>` : ''} ${esc(d.service)}${d.object ? ` <span class="object">${esc(d.object)}</span>` : ''}: ${esc(d.summary)}</li>`)
    .join('');
}

function frame(): void {
  if (store.dirty) {
    store.dirty = false;
    renderHealth();
    renderFlows();
    renderPath();
    renderDistribution();
  }
  requestAnimationFrame(frame);
}

function init(): void {
  $('flows-body').addEventListener('click', (ev) => {
    const row = (ev.target as HTMLElement).closest('tr');
    if (row?.dataset.flow) {
      selected = row.dataset.flow;
      store.dirty = true;
    }
  });
  $<HTMLSelectElement>('node-filter').addEventListener('change', (ev) => {
    nodeFilter = (ev.target as HTMLSelectElement).value;
    store.dirty = true;
  });
  $<HTMLInputElement>('filter').addEventListener('input', (ev) => {
    filterText = (ev.target as HTMLInputElement).value;
    store.dirty = true;
  });
  $('pause').addEventListener('click', () => {
    paused = !paused;
    $('pause').textContent = paused ? 'resume' : 'pause';
  });
  $<HTMLSelectElement>('dist-service').addEventListener('change', (ev) => {
    chartService = (ev.target as HTMLSelectElement).value;
    store.dirty = true;
  });
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem('svctrace-token', $<HTMLInputElement>('token').value.trim());
    client?.close();
    if (!client) void connect();
  });
  void connect();
  requestAnimationFrame(frame);
  // For tests and curious users: the store, read-only.
  (window as unknown as { svctrace: { store: Store } }).svctrace = { store };
}

init();
