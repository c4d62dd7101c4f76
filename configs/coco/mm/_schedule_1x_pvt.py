# The paper's Mask R-CNN 1x recipe for InLine-PVT (PVT's): AdamW lr 2e-4, weight decay 1e-4, 12
# epochs of 16 images per iteration, lr x 0.1 after epochs 8 and 11, linear warm-up over 500
# iterations from 0.001 x lr; single-scale training at (1333, 800).
_base_ = ["./_coco_instance.py"]
optim_wrapper = dict(type="OptimWrapper", optimizer=dict(type="AdamW", lr=2e-4, weight_decay=1e-4))
param_scheduler = [
    dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type="MultiStepLR", begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
train_cfg = dict(type="EpochBasedTrainLoop", max_epochs=12, val_interval=1)
