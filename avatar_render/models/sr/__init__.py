"""Super-resolution models: the Wan2.1 VAE decoder fine-tuned to decode at 2x (``vae2x``) and the
one-step video restoration model SwiftVR (``reae``, ``swiftvr_dit``, ``windows``, ``swiftvr``)."""
