-- SRPC case study "partial write": change a few bytes of a file at the server instead of
-- reading, modifying and writing it all back. Arguments: path, offset. The new bytes are
-- the input buffer. Returns the number of bytes written.
local path, offset = ...
local f, err = fs.open(path, 2, 0)  -- open_flags.WRITE
if not f then return nil, err end
local n, werr = fs.pwrite(f.handle, offset, input)
fs.close(f.handle)
if not n then return nil, werr end
return n
