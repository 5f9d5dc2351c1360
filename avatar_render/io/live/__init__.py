"""Live sinks: the same encoded fragments as the file, published while the render runs (HLS, RTMP,
SRT, fragmented MP4 on standard output) and a loopback HTTP server with a watch page."""
