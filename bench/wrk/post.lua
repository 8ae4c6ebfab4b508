-- POST one fixed body over and over (wrk -s bench/wrk/post.lua URL).
--   BENCH_BODY                 file holding the request body (read once, at start-up)
--   BENCH_CONTENT_TYPE         Content-Type header (default application/json)
--   BENCH_HEADER_LENGTH        if set, sent as Inference-Header-Content-Length (binary requests)
--   BENCH_AUTHORIZATION        if set, sent as the Authorization header (token benchmarks)
-- At the end one line "BENCH_RESULT {json}" reports counts and latency percentiles (us), so
-- bench/run.py never has to parse wrk's human-readable output.

local path = assert(os.getenv("BENCH_BODY"), "BENCH_BODY is not set")
local file = assert(io.open(path, "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = os.getenv("BENCH_CONTENT_TYPE") or "application/json"
local header_length = os.getenv("BENCH_HEADER_LENGTH")
if header_length ~= nil and header_length ~= "" then
  wrk.headers["Inference-Header-Content-Length"] = header_length
end
local authorization = os.getenv("BENCH_AUTHORIZATION")
if authorization ~= nil and authorization ~= "" then
  wrk.headers["Authorization"] = authorization
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"mean": %.2f, "p50": %d, "p90": %d, "p99": %d, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end
