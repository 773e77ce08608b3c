"""Tools to run the platform on one machine: the embedded platform driven by Dagster's daemon code
(`xirang demo`, the admission benchmark), the scripted demo, the `dagster dev` server the live tests
start, a headless browser, and the crash test's deployment."""
