"""The model: family adapters (arch/), layout, surgery, cost, the checkpoint file, import; engine formats (formats/)."""
