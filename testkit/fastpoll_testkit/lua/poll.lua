-- wrk script for every fastpoll benchmark, so every system is driven by the same client code.
-- Configured through the environment (bench.py sets it; wrk's LuaJIT has os.getenv):
--   FP_PATH     path of the poll URL, e.g. /Poll/getMessages (or /getMessages for a poller)
--   FP_TARGETS  file of query strings to poll, one per line ("user_id=N&exp=E&sig=S": poll URLs
--               are signed, so they are made before the load); without it: "user_id=1"
--   FP_USERS    use the first FP_USERS lines (1 = one hot key shared by every client)
--   FP_HIT      share of requests taken from FP_TARGETS (default 1); the rest from FP_MISSES
--   FP_MISSES   file of query strings of users never polled before (each one is a miss once);
--               thread t of n takes lines t, t+n, ...; if they run out they are reused and
--               counted as miss_reused (they are hits by then)
--   FP_METHOD   GET or POST (POST sends FP_BODY, default a small JSON document)
--   FP_CHECK    "hit": every answer must be 200 with a preloaded body;
--               "any": 200 with a preloaded or an empty body; "status": 200 and a non-empty
--               body (the app's own answers); unset: no check (a faster client)
--   FP_SOURCE   if set, the X-Poll-Source header must equal it on every checked preloaded body
-- done() prints one line "FPBENCH {json}" with exact figures; bench.py prefers it to the text.

local path = os.getenv("FP_PATH") or "/Poll/getMessages"
local targets_file = os.getenv("FP_TARGETS")
local users = tonumber(os.getenv("FP_USERS") or "0")
local hit = tonumber(os.getenv("FP_HIT") or "1")
local misses_file = os.getenv("FP_MISSES")
local method = os.getenv("FP_METHOD") or "GET"
local body = os.getenv("FP_BODY") or '{"since":0}'
local check = os.getenv("FP_CHECK")
local source = os.getenv("FP_SOURCE")

local threads = {}
local counter = 1

function setup(thread)
   thread:set("tid", counter)
   table.insert(threads, thread)
   counter = counter + 1
end

local headers = {}
local req_body = nil
if method == "POST" then
   headers["Content-Type"] = "application/json"
   req_body = body
end

local function read_lines(file, limit, every, first)
   local out = {}
   local f = assert(io.open(file, "r"))
   local i = 0
   for line in f:lines() do
      if limit > 0 and i >= limit then
         break
      end
      if every == nil or i % every == first then
         out[#out + 1] = line
      end
      i = i + 1
   end
   f:close()
   return out
end

local hits = {}
local miss_reqs = {}
local n_targets = 0
local n_misses = 0
local next_miss = 0

function init(args)
   math.randomseed(tid * 7919 + os.time())
   -- Pre-built requests: request() must cost the client as little as possible.
   local queries = { "user_id=1" }
   if targets_file then
      queries = read_lines(targets_file, users)
   end
   for i, q in ipairs(queries) do
      hits[i] = wrk.format(method, path .. "?" .. q, headers, req_body)
   end
   n_targets = #hits
   if hit < 1 then
      local nthreads = tonumber(os.getenv("FP_THREADS") or "1")
      for i, q in ipairs(read_lines(assert(misses_file, "FP_MISSES needed"), 0, nthreads,
                                    tid - 1)) do
         miss_reqs[i] = wrk.format(method, path .. "?" .. q, headers, req_body)
      end
      n_misses = #miss_reqs
   end
   n_hit, n_miss, miss_reused, bad_status, bad_body, bad_source = 0, 0, 0, 0, 0, 0
end

function request()
   if hit >= 1 or math.random() < hit then
      n_hit = n_hit + 1
      if n_targets == 1 then
         return hits[1]
      end
      return hits[math.random(n_targets)]
   end
   n_miss = n_miss + 1
   next_miss = next_miss + 1
   if next_miss > n_misses then
      next_miss = 1
   end
   if n_miss > n_misses then
      miss_reused = miss_reused + 1
   end
   return miss_reqs[next_miss]
end

local function preloaded(b)
   local a, c = b:match('^{"unread":1,"newest":{"id":(%d+),"text":"bench (%d+)"}}$')
   return a ~= nil and a == c
end

if check == "hit" or check == "any" or check == "status" then
   function response(status, hdrs, b)
      if status ~= 200 then
         bad_status = bad_status + 1
         return
      end
      if check == "status" then
         if b == "" then
            bad_body = bad_body + 1
         end
      elseif preloaded(b) then
         if source and hdrs["X-Poll-Source"] ~= source then
            bad_source = bad_source + 1
         end
      elseif check == "hit" or b ~= "" then
         bad_body = bad_body + 1
      end
   end
end

function done(summary, latency, requests)
   local t = { n_hit = 0, n_miss = 0, miss_reused = 0, bad_status = 0, bad_body = 0,
               bad_source = 0 }
   for _, thread in ipairs(threads) do
      for k, _ in pairs(t) do
         t[k] = t[k] + (thread:get(k) or 0)
      end
   end
   local e = summary.errors
   local out = string.format(
      '{"duration_us":%d,"requests":%d,"bytes":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"mean":%.1f,"max":%d,"p50":%d,"p75":%d,"p90":%d,"p99":%d,"p999":%d},' ..
      '"checked":%s,"n_hit":%d,"n_miss":%d,"miss_reused":%d,' ..
      '"bad_status":%d,"bad_body":%d,"bad_source":%d}',
      summary.duration, summary.requests, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.mean, latency.max, latency:percentile(50), latency:percentile(75),
      latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
      (check and "true" or "false"), t.n_hit, t.n_miss, t.miss_reused,
      t.bad_status, t.bad_body, t.bad_source)
   io.write("FPBENCH " .. out .. "\n")
end
