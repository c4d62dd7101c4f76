"""Dense prediction's data: the data sets (ADE20K, the Fashion-MNIST mosaics, a COCO-layout
folder), their augmentations (mmseg's pipeline, the boxes' flip), the COCO format (export,
reader, box AP) and a config's data sets with their step-indexed batches (:mod:`.loading`).

What belongs here reads images, labels and boxes; it imports no model and no task module of
``dense`` (``tests/test_layering.py``), only the dense config classes it is built from."""
