-- wrk script for every fastpoll benchmark, so every system is driven by the same client code.
-- Configured through the environment (bench.py sets it; wrk's LuaJIT has os.getenv):
--   FP_PATH         path of the poll URL, e.g. /Poll/getMessages (or /getMessages for a poller)
--   FP_USERS        hit users are 1..FP_USERS (1 = one hot key shared by every client)
--   FP_USER_BASE    added to every hit user id (default 0)
--   FP_HIT          share of requests for a preloaded (hit) user, 0..1 (default 1)
--   FP_MISS_PREFIX  digits; a miss polls a user id never used before: prefix .. thread .. counter
--   FP_METHOD       GET or POST (POST sends FP_BODY, default a small JSON document)
--   FP_ZERO_PAD     "1": send user ids as 0NNN (the app answers them but never touches the cache)
--   FP_CHECK        "hit": every answer must be 200 with a preloaded body;
--                   "any": 200 with a preloaded or an empty body; "status": 200 and a non-empty
--                   body (the app's own answers); unset: no check (a faster client)
--   FP_SOURCE       if set, the X-Poll-Source header must equal it on every checked hit
-- done() prints one line "FPBENCH {json}" with exact figures; bench.py prefers it to the text.

local path = os.getenv("FP_PATH") or "/Poll/getMessages"
local users = tonumber(os.getenv("FP_USERS") or "1")
local user_base = tonumber(os.getenv("FP_USER_BASE") or "0")
local hit = tonumber(os.getenv("FP_HIT") or "1")
local miss_prefix = os.getenv("FP_MISS_PREFIX") or "9"
local method = os.getenv("FP_METHOD") or "GET"
local body = os.getenv("FP_BODY") or '{"since":0}'
local pad = (os.getenv("FP_ZERO_PAD") == "1") and "0" or ""
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

local function url(uid)
   return path .. "?user_id=" .. pad .. uid
end

local hits = {}
local misses = 0

function init(args)
   math.randomseed(tid * 7919 + os.time())
   -- Pre-built requests: request() must cost the client as little as possible.
   for u = 1, users do
      hits[u] = wrk.format(method, url(string.format("%d", user_base + u)), headers, req_body)
   end
   n_hit, n_miss, bad_status, bad_body, bad_source = 0, 0, 0, 0, 0
end

function request()
   if hit >= 1 or math.random() < hit then
      n_hit = n_hit + 1
      if users == 1 then
         return hits[1]
      end
      return hits[math.random(users)]
   end
   n_miss = n_miss + 1
   misses = misses + 1
   return wrk.format(method, url(miss_prefix .. tid .. string.format("%07d", misses)), headers,
                     req_body)
end

local function preloaded(b)
   local a, c = b:match('^{"unread":1,"newest":{"id":(%d+),"text":"bench (%d+)"}}$')
   return a ~= nil and a == c and tonumber(a) >= 1 and tonumber(a) <= users
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
   local t = { n_hit = 0, n_miss = 0, bad_status = 0, bad_body = 0, bad_source = 0 }
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
      '"checked":%s,"n_hit":%d,"n_miss":%d,"bad_status":%d,"bad_body":%d,"bad_source":%d}',
      summary.duration, summary.requests, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.mean, latency.max, latency:percentile(50), latency:percentile(75),
      latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
      (check and "true" or "false"), t.n_hit, t.n_miss, t.bad_status, t.bad_body, t.bad_source)
   io.write("FPBENCH " .. out .. "\n")
end
