"""The model: family adapters (arch/), layout, surgery, cost, the checkpoint file, import and export."""
