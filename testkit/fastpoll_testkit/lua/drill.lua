-- fastpoll drill script: round-robin over the requests in FP_REQUESTS (one "METHOD target"
-- per line), tally answers, stop after FP_LIMIT requests per thread (0: no limit); with
-- FP_CLOSE = 1 every request asks for its own connection (Connection: close), as ab without -k.
local threads = {}
local reqs, n, i, limit, count, marker = {}, 0, 0, 0, 0, nil
statuses, sources = {}, {}  -- globals: done() reads them with thread:get()

function setup(thread)
   table.insert(threads, thread)
   thread:set("id", #threads)
end

function init(args)
   local path, lim, close = args[1], tonumber(args[2]) or 0, args[3] == "1"
   marker = args[4] .. "/done-" .. tostring(id)
   limit = lim
   local headers = nil
   if close then headers = { ["Connection"] = "close" } end
   for line in io.lines(path) do
      local method, target = line:match("^(%S+) (%S+)$")
      if method then
         local body = nil
         if method == "POST" then body = "x=1" end
         n = n + 1
         reqs[n] = wrk.format(method, target, headers, body)
      end
   end
   -- every thread starts at another offset, so keys are spread from the first second
   i = ((id or 0) * 7919) % n
end

function request()
   i = i % n + 1
   return reqs[i]
end

function response(status, headers, body)
   local s = tostring(status)
   statuses[s] = (statuses[s] or 0) + 1
   local src = headers["X-Poll-Source"] or headers["x-poll-source"] or "-"
   sources[src] = (sources[src] or 0) + 1
   count = count + 1
   if limit > 0 and count == limit then
      -- wrk runs for its whole -d even when every thread stopped: tell Python, which
      -- interrupts it (SIGINT: wrk then prints its summary and calls done()).
      local f = io.open(marker, "w")
      if f then f:close() end
      wrk.thread:stop()
   end
end

local function merge(into, t)
   for k, v in pairs(t) do into[k] = (into[k] or 0) + v end
end

local function obj(t)
   local parts = {}
   for k, v in pairs(t) do table.insert(parts, string.format("%q:%d", k, v)) end
   return "{" .. table.concat(parts, ",") .. "}"
end

function done(summary, latency, requests)
   local st, so = {}, {}
   for _, t in ipairs(threads) do
      merge(st, t:get("statuses"))
      merge(so, t:get("sources"))
   end
   local e = summary.errors
   io.write(string.format(
      'FPJSON {"requests":%d,"duration_us":%d,"statuses":%s,"sources":%s,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d}}\n',
      summary.requests, summary.duration, obj(st), obj(so),
      e.connect, e.read, e.write, e.timeout))
end
