"""What the gate tells about itself: the recorder (decision rows, samples, audit rows,
gauges), the snapshot builder, Prometheus metrics, GPU readings (the only pynvml import).

May know: the layers below (core, data, config, journal, backend, fleet). Never the HTTP
server or the operator layer.
"""
