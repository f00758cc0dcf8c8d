-- SRPC case study "read-if-modified-since": return the file only if it changed after the
-- client's cached modification time. Arguments: path, cached mtime (seconds), cached
-- mtime (nanoseconds). Returns "unchanged", or "changed" and the attributes, with the
-- contents in the output buffer.
local path, sec, nsec = ...
local st, err = fs.stat(path)
if not st then return nil, err end
if st.mtime.sec == sec and st.mtime.nsec == nsec then
  return "unchanged"
end
local _, data = fs.get(path)
output:append(data or "")
return "changed", st
